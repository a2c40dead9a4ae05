#include "backend/internal/linear_parts.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvmesh::backend::internal {

bool IsFloatWeightDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

absl::StatusOr<LinearPartsInfo> ValidateLinearParts(std::span<const TensorView> parts,
                                                    std::span<const TensorView> biases) {
  if (parts.empty()) return absl::InvalidArgumentError("PackLinear: no weight parts");
  if (!biases.empty() && biases.size() != parts.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackLinear: ", biases.size(), " biases for ", parts.size(), " weight parts"));
  }
  LinearPartsInfo info;
  info.dtype = parts[0].dtype;
  info.in_features = parts[0].rank == 2 ? parts[0].shape[1] : 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const TensorView& w = parts[i];
    if (w.data == nullptr || w.rank != 2 || w.shape[0] <= 0 || w.shape[1] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("PackLinear: part ", i, " is not a non-empty [N, K] matrix: ",
                                                     w.DebugString()));
    }
    if (!IsFloatWeightDType(w.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("PackLinear: part ", i, " has unsupported dtype ", DTypeName(w.dtype).data()));
    }
    if (w.dtype != info.dtype) {
      return absl::InvalidArgumentError(absl::StrCat("PackLinear: part ", i, " is ", DTypeName(w.dtype).data(),
                                                     ", part 0 is ", DTypeName(info.dtype).data()));
    }
    if (w.shape[1] != info.in_features) {
      return absl::InvalidArgumentError(absl::StrCat("PackLinear: part ", i, " has K = ", w.shape[1],
                                                     ", part 0 has K = ", info.in_features));
    }
    if (w.strides[1] != 1 || w.strides[0] < w.shape[1]) {
      return absl::InvalidArgumentError(absl::StrCat("PackLinear: part ", i, " rows are not contiguous"));
    }
    info.out_features += w.shape[0];
    info.num_bytes += w.shape[0] * w.shape[1] * DTypeSize(w.dtype);
    if (!biases.empty()) {
      const TensorView& b = biases[i];
      if (b.data == nullptr || !IsFloatWeightDType(b.dtype) || b.num_elements() != w.shape[0] ||
          !b.is_contiguous()) {
        return absl::InvalidArgumentError(absl::StrCat("PackLinear: bias ", i, " ", b.DebugString(),
                                                       " does not match part ", i, " with N = ", w.shape[0]));
      }
      info.num_bytes += w.shape[0] * 4;
    }
  }
  return info;
}

}  // namespace kvmesh::backend::internal
