#include "engine/dense_kv_cache.h"

#include <string>

#include "core/dtype.h"

#include "absl/strings/str_cat.h"

namespace kvmesh::engine {

absl::StatusOr<DenseKvCache> DenseKvCache::Create(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
                                                  int64_t capacity_tokens, DType element_dtype) {
  if (element_dtype != DType::kF32 && element_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("DenseKvCache: KV element type must be f32 or bf16, not ", std::string(DTypeName(element_dtype))));
  }
  if (num_layers <= 0 || num_kv_heads <= 0 || head_dim <= 0 || capacity_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("DenseKvCache: sizes must be positive (layers=", num_layers,
                                                   " kv_heads=", num_kv_heads, " head_dim=", head_dim,
                                                   " capacity=", capacity_tokens, ")"));
  }
  DenseKvCache cache(num_layers, num_kv_heads, head_dim, capacity_tokens);
  cache.element_dtype_ = element_dtype;
  return cache;
}

DenseKvCache::DenseKvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t capacity_tokens)
    : num_kv_heads_(num_kv_heads), head_dim_(head_dim), capacity_tokens_(capacity_tokens) {
  const size_t per_layer = static_cast<size_t>(capacity_tokens * num_kv_heads * head_dim);
  keys_.assign(num_layers, std::vector<float>(per_layer, 0.0f));
  values_.assign(num_layers, std::vector<float>(per_layer, 0.0f));
}

TensorView DenseKvCache::View(std::vector<float>& storage, int64_t begin, int64_t n) {
  return TensorView::Contiguous(storage.data() + begin * num_kv_heads_ * head_dim_, DType::kF32,
                                {n, num_kv_heads_, head_dim_});
}

TensorView DenseKvCache::keys(int64_t layer, int64_t end) { return View(keys_[layer], 0, end); }
TensorView DenseKvCache::values(int64_t layer, int64_t end) { return View(values_[layer], 0, end); }
TensorView DenseKvCache::key_slots(int64_t layer, int64_t begin, int64_t n) { return View(keys_[layer], begin, n); }
TensorView DenseKvCache::value_slots(int64_t layer, int64_t begin, int64_t n) {
  return View(values_[layer], begin, n);
}

void DenseKvCache::RoundToStoragePrecision(int64_t layer, int64_t begin, int64_t n) {
  if (element_dtype_ == DType::kF32) return;
  const size_t first = static_cast<size_t>(begin * num_kv_heads_ * head_dim_);
  const size_t count = static_cast<size_t>(n * num_kv_heads_ * head_dim_);
  for (std::vector<float>* storage : {&keys_[layer], &values_[layer]}) {
    for (size_t i = first; i < first + count; ++i) (*storage)[i] = RoundToBf16((*storage)[i]);
  }
}

int64_t DenseKvCache::num_bytes() const {
  return static_cast<int64_t>(keys_.size()) * 2 * capacity_tokens_ * num_kv_heads_ * head_dim_ *
         static_cast<int64_t>(sizeof(float));
}

}  // namespace kvmesh::engine
