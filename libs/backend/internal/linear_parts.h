// Validation of PackLinear's arguments, shared by every backend so that they
// accept and reject exactly the same inputs.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/tensor_view.h"

namespace kvmesh::backend::internal {

struct LinearPartsInfo {
  int64_t out_features = 0;  // sum of the parts' N_i
  int64_t in_features = 0;   // K
  DType dtype = DType::kF32;
  // Weight bytes in the source dtype plus 4 bytes per bias element.
  int64_t num_bytes = 0;
};

// True for the weight dtypes PackLinear accepts (f32, bf16, f16).
bool IsFloatWeightDType(DType dtype);

// Checks `parts` (each [N_i, K], same K and dtype, inner stride 1) and `biases`
// (empty, or one [N_i] float view per part, contiguous). InvalidArgument naming
// the first offending part otherwise.
absl::StatusOr<LinearPartsInfo> ValidateLinearParts(std::span<const TensorView> parts,
                                                    std::span<const TensorView> biases);

}  // namespace kvmesh::backend::internal
