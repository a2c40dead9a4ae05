// DenseKvCache: one sequence's attention keys and values, contiguous per layer.
//
// The foundation's single-request path and the numerics oracle for the paged
// engine: layer l holds K and V as [capacity_tokens, num_kv_heads, head_dim] f32.
// Positions 0..num_tokens()-1 are filled. With a bf16 element type the values are
// kept rounded to bf16 (RoundToStoragePrecision), so this path sees exactly what a
// bf16 paged cache holds.
//
// Thread-safety: not thread-safe; owned by the one request that uses it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor_view.h"

namespace kvmesh::engine {

class DenseKvCache {
 public:
  // InvalidArgument for non-positive sizes.
  // `element_dtype`: kF32 or kBF16 (the precision K and V are kept at).
  static absl::StatusOr<DenseKvCache> Create(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
                                             int64_t capacity_tokens, DType element_dtype = DType::kF32);

  int64_t capacity_tokens() const { return capacity_tokens_; }
  int64_t num_tokens() const { return num_tokens_; }
  // Marks `n` more positions as filled (the model has written them).
  void Advance(int64_t n) { num_tokens_ += n; }
  void Reset() { num_tokens_ = 0; }

  // [end, Hkv, D] views of positions 0..end-1 of layer `layer`.
  TensorView keys(int64_t layer, int64_t end);
  TensorView values(int64_t layer, int64_t end);
  // [n, Hkv, D] views of positions begin..begin+n-1.
  TensorView key_slots(int64_t layer, int64_t begin, int64_t n);
  TensorView value_slots(int64_t layer, int64_t begin, int64_t n);

  int64_t num_bytes() const;
  // Rounds positions begin..begin+n-1 of `layer` to the element type (a no-op for f32).
  void RoundToStoragePrecision(int64_t layer, int64_t begin, int64_t n);

 private:
  DenseKvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t capacity_tokens);
  TensorView View(std::vector<float>& storage, int64_t begin, int64_t n);

  int64_t num_kv_heads_;
  int64_t head_dim_;
  int64_t capacity_tokens_;
  int64_t num_tokens_ = 0;
  DType element_dtype_ = DType::kF32;
  std::vector<std::vector<float>> keys_;    // [layer][capacity * Hkv * D]
  std::vector<std::vector<float>> values_;  // [layer][capacity * Hkv * D]
};

}  // namespace kvmesh::engine
