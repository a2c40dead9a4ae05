// Dequantization of GGUF tensor data (ggml block formats) to f32 and bf16.
//
// The f32 values are bit-identical to the PyPI `gguf` package's
// gguf.quants.dequantize (which is llama.cpp's own reference): each element is
// computed with the same f32 operations in the same order (d * q, then - m or
// + m as that code does it, no fused multiply-add; the file is compiled with
// -ffp-contract=off). bf16 is that f32 rounded to nearest, ties to even, as
// torch's .to(torch.bfloat16) and kvmesh's F32ToBf16 round.
//
// Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace kvmesh::model {

// True when DequantizeToF32 accepts `ggml_type`.
bool CanDequantize(uint32_t ggml_type);

// Writes out.size() elements decoded from `data` (exactly the bytes of
// out.size() elements of `ggml_type`). InvalidArgument for an unsupported type,
// an element count that is not a whole number of blocks, or a byte count that
// does not match.
absl::Status DequantizeToF32(uint32_t ggml_type, std::span<const uint8_t> data, std::span<float> out);

// DequantizeToF32, then each element rounded to bf16 (raw bits).
absl::Status DequantizeToBf16(uint32_t ggml_type, std::span<const uint8_t> data, std::span<uint16_t> out);

}  // namespace kvmesh::model
