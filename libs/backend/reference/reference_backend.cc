// The scalar oracle: every op of ops.h as plain loops. Values are widened to
// f32 exactly; sums are accumulated in f64 and rounded to f32 once at the end,
// so this backend is (nearly) the correctly rounded result the fast backends
// are compared against. Slow by design; never used to serve.
//
// Thread-safety: the backend holds no mutable state but the error RecordError keeps
// (ops.h); its ops may run concurrently on distinct outputs.
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/internal/linear_parts.h"
#include "backend/ops.h"
#include "core/dtype.h"
#include "core/tensor_view.h"

namespace kvmesh::backend {
namespace {

// The weight widened to f32, row-major [N, K], and the bias ([N] f32, or empty).
class ReferencePackedLinear final : public PackedLinear {
 public:
  ReferencePackedLinear(int64_t n, int64_t k, DType dtype, int64_t num_bytes, std::vector<float> weight,
                        std::vector<float> bias)
      : n_(n), k_(k), dtype_(dtype), num_bytes_(num_bytes), weight_(std::move(weight)), bias_(std::move(bias)) {}

  int64_t out_features() const override { return n_; }
  int64_t in_features() const override { return k_; }
  DType dtype() const override { return dtype_; }
  int64_t num_bytes() const override { return num_bytes_; }

  const float* weight() const { return weight_.data(); }
  const std::vector<float>& bias() const { return bias_; }

 private:
  const int64_t n_;
  const int64_t k_;
  const DType dtype_;
  const int64_t num_bytes_;
  const std::vector<float> weight_;  // [N, K]
  const std::vector<float> bias_;    // [N] or empty
};

class ReferenceBackend final : public Backend {
 public:
  std::string_view name() const override { return "reference"; }

  absl::StatusOr<std::unique_ptr<PackedLinear>> PackLinear(std::span<const TensorView> parts,
                                                           std::span<const TensorView> biases) override {
    absl::StatusOr<internal::LinearPartsInfo> info = internal::ValidateLinearParts(parts, biases);
    if (!info.ok()) return info.status();
    const int64_t n = info->out_features;
    const int64_t k = info->in_features;
    std::vector<float> weight(static_cast<size_t>(n * k));
    std::vector<float> bias(biases.empty() ? 0 : static_cast<size_t>(n));
    int64_t row0 = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
      const TensorView& w = parts[p];
      for (int64_t r = 0; r < w.shape[0]; ++r) {
        for (int64_t c = 0; c < k; ++c) {
          weight[(row0 + r) * k + c] = LoadAsF32(w.data, w.dtype, r * w.strides[0] + c * w.strides[1]);
        }
        if (!biases.empty()) {
          const TensorView& b = biases[p];
          bias[row0 + r] = LoadAsF32(b.data, b.dtype, r);
        }
      }
      row0 += w.shape[0];
    }
    return std::unique_ptr<PackedLinear>(
        new ReferencePackedLinear(n, k, info->dtype, info->num_bytes, std::move(weight), std::move(bias)));
  }

  void Linear(const TensorView& x, const PackedLinear& packed, const TensorView& out) override {
    const auto& w = static_cast<const ReferencePackedLinear&>(packed);
    const int64_t t_count = x.shape[0];
    const int64_t k = w.in_features();
    const int64_t n = w.out_features();
    const float* xs = x.data_as<const float>();
    float* o = out.data_as<float>();
    for (int64_t t = 0; t < t_count; ++t) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        const float* wr = w.weight() + j * k;
        for (int64_t c = 0; c < k; ++c) acc += static_cast<double>(xs[t * k + c]) * wr[c];
        if (!w.bias().empty()) acc += w.bias()[j];
        o[t * n + j] = static_cast<float>(acc);
      }
    }
  }

  void Embedding(std::span<const int32_t> ids, const TensorView& table, const TensorView& out) override {
    const int64_t e = table.shape[1];
    float* o = out.data_as<float>();
    for (size_t t = 0; t < ids.size(); ++t) {
      for (int64_t c = 0; c < e; ++c) {
        o[static_cast<int64_t>(t) * e + c] = LoadAsF32(table.data, table.dtype, ids[t] * table.strides[0] + c);
      }
    }
  }

  void EmbeddingShard(std::span<const int32_t> ids, const TensorView& table, int64_t first_id,
                      const TensorView& out) override {
    const int64_t v = table.shape[0];
    const int64_t e = table.shape[1];
    float* o = out.data_as<float>();
    for (size_t t = 0; t < ids.size(); ++t) {
      const int64_t row = ids[t] - first_id;
      for (int64_t c = 0; c < e; ++c) {
        o[static_cast<int64_t>(t) * e + c] =
            row >= 0 && row < v ? LoadAsF32(table.data, table.dtype, row * table.strides[0] + c) : 0.0f;
      }
    }
  }

  void RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) override {
    const int64_t t_count = x.shape[0];
    const int64_t e = x.shape[1];
    const float* xs = x.data_as<const float>();
    float* o = out.data_as<float>();
    for (int64_t t = 0; t < t_count; ++t) {
      double ss = 0.0;
      for (int64_t c = 0; c < e; ++c) ss += static_cast<double>(xs[t * e + c]) * xs[t * e + c];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(e) + eps);
      for (int64_t c = 0; c < e; ++c) {
        o[t * e + c] = static_cast<float>(xs[t * e + c] * inv * LoadAsF32(weight.data, weight.dtype, c));
      }
    }
  }

  void AddRmsNorm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                  const TensorView& out) override {
    float* r = residual.data_as<float>();
    const float* xs = x.data_as<const float>();
    const int64_t count = residual.num_elements();
    for (int64_t i = 0; i < count; ++i) r[i] += xs[i];
    RmsNorm(residual, weight, eps, out);
  }

  void ApplyRope(const TensorView& q, const TensorView& k, std::span<const int32_t> positions,
                 std::span<const float> inv_freq) override {
    const int64_t d = q.shape[2];
    const int64_t half = d / 2;
    std::vector<float> cos_v(static_cast<size_t>(half));
    std::vector<float> sin_v(static_cast<size_t>(half));
    for (size_t t = 0; t < positions.size(); ++t) {
      for (int64_t i = 0; i < half; ++i) {
        // NOTE: the angle is rounded to f32 first, as transformers computes it;
        // cos/sin of that f32 angle are then correctly rounded.
        const float angle = static_cast<float>(positions[t]) * inv_freq[i];
        cos_v[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
        sin_v[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
      }
      for (const TensorView* tv : {&q, &k}) {
        const int64_t heads = tv->shape[1];
        float* base = tv->data_as<float>() + static_cast<int64_t>(t) * heads * d;
        for (int64_t h = 0; h < heads; ++h) {
          float* v = base + h * d;
          for (int64_t i = 0; i < half; ++i) {
            const float x1 = v[i];
            const float x2 = v[i + half];
            v[i] = x1 * cos_v[i] - x2 * sin_v[i];
            v[i + half] = x2 * cos_v[i] + x1 * sin_v[i];
          }
        }
      }
    }
  }

  void SiluAndMul(const TensorView& gate_up, const TensorView& out) override {
    const int64_t t_count = gate_up.shape[0];
    const int64_t inter = out.shape[1];
    const float* g = gate_up.data_as<const float>();
    float* o = out.data_as<float>();
    for (int64_t t = 0; t < t_count; ++t) {
      for (int64_t i = 0; i < inter; ++i) {
        const double a = g[t * 2 * inter + i];
        const double b = g[t * 2 * inter + inter + i];
        o[t * inter + i] = static_cast<float>(a / (1.0 + std::exp(-a)) * b);
      }
    }
  }

  void DenseAttention(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                      std::span<const int32_t> positions, float scale, const TensorView& out) override {
    const int64_t t_count = q.shape[0];
    const int64_t heads = q.shape[1];
    const int64_t d = q.shape[2];
    const int64_t kv_heads = k_cache.shape[1];
    const int64_t group = heads / kv_heads;
    const float* qs = q.data_as<const float>();
    const float* ks = k_cache.data_as<const float>();
    const float* vs = v_cache.data_as<const float>();
    float* o = out.data_as<float>();
    std::vector<double> scores;
    std::vector<double> acc(static_cast<size_t>(d));
    for (int64_t t = 0; t < t_count; ++t) {
      const int64_t len = static_cast<int64_t>(positions[t]) + 1;
      scores.assign(static_cast<size_t>(len), 0.0);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t kvh = h / group;
        const float* qv = qs + (t * heads + h) * d;
        double max_score = -INFINITY;
        for (int64_t s = 0; s < len; ++s) {
          const float* kv = ks + (s * kv_heads + kvh) * d;
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(qv[c]) * kv[c];
          scores[s] = dot * scale;
          if (scores[s] > max_score) max_score = scores[s];
        }
        double denom = 0.0;
        for (int64_t s = 0; s < len; ++s) {
          scores[s] = std::exp(scores[s] - max_score);
          denom += scores[s];
        }
        for (int64_t c = 0; c < d; ++c) acc[c] = 0.0;
        for (int64_t s = 0; s < len; ++s) {
          const float* vv = vs + (s * kv_heads + kvh) * d;
          for (int64_t c = 0; c < d; ++c) acc[c] += scores[s] * vv[c];
        }
        for (int64_t c = 0; c < d; ++c) o[(t * heads + h) * d + c] = static_cast<float>(acc[c] / denom);
      }
    }
  }

  void CopyColumns(const TensorView& src, int64_t src_col, const TensorView& dst, int64_t dst_col,
                   int64_t width) override {
    const int64_t ns = src.shape[1];
    const int64_t nd = dst.shape[1];
    const float* s = src.data_as<const float>();
    float* d = dst.data_as<float>();
    for (int64_t t = 0; t < src.shape[0]; ++t) {
      for (int64_t j = 0; j < width; ++j) d[t * nd + dst_col + j] = s[t * ns + src_col + j];
    }
  }

  void GatherAddRows(const TensorView& a, const TensorView& b, std::span<const int32_t> rows,
                     const TensorView& out) override {
    const int64_t e = a.shape[1];
    const float* as = a.data_as<const float>();
    const float* bs = b.data_as<const float>();
    float* o = out.data_as<float>();
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int64_t c = 0; c < e; ++c) {
        o[static_cast<int64_t>(i) * e + c] = as[rows[i] * e + c] + bs[rows[i] * e + c];
      }
    }
  }

  // One pass per row, keeping the first strictly larger value: NaN is skipped, +inf
  // read as FLT_MAX, and -inf never beats the starting -inf (so a row of only NaN and
  // -inf gives -1, as the host sampler's greedy path does).
  void ArgmaxRows(const TensorView& x, std::span<int32_t> out) override {
    const int64_t v = x.shape[1];
    const float* xs = x.data_as<const float>();
    for (size_t r = 0; r < out.size(); ++r) {
      int32_t best = -1;
      float best_value = -INFINITY;
      for (int64_t j = 0; j < v; ++j) {
        const float value = xs[static_cast<int64_t>(r) * v + j];
        if (std::isnan(value)) continue;
        const float read = value > FLT_MAX ? FLT_MAX : value;
        if (read > best_value) {
          best_value = read;
          best = static_cast<int32_t>(j);
        }
      }
      out[r] = best;
    }
  }

  void CopyBlocks(const BlockPool& pool, std::span<const int32_t> pairs) override { SwapBlocks(pool, pool, pairs); }

  // Byte by byte, pair after pair, layer after layer.
  void SwapBlocks(const BlockPool& src, const BlockPool& dst, std::span<const int32_t> pairs) override {
    for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
      for (int64_t layer = 0; layer < src.num_layers; ++layer) {
        const std::byte* from = src.data + layer * src.layer_bytes + pairs[i] * src.block_bytes;
        std::byte* to = dst.data + layer * dst.layer_bytes + pairs[i + 1] * dst.block_bytes;
        for (int64_t b = 0; b < src.block_bytes; ++b) to[b] = from[b];
      }
    }
  }

  void ScatterPairs(std::span<const int32_t> updates, std::span<int32_t> array) override {
    for (size_t i = 0; i + 1 < updates.size(); i += 2) array[static_cast<size_t>(updates[i])] = updates[i + 1];
  }

  // Element by element, as ops.h writes it.
  void GatherTableRows(std::span<const int32_t> rows, int64_t row_stride, std::span<const int32_t> rows_of,
                       std::span<const int32_t> context_lens, int32_t block_size_tokens,
                       std::span<int32_t> out) override {
    const size_t s = rows_of.size();
    const size_t out_cols = out.size() / s;
    for (size_t i = 0; i < s; ++i) {
      const int64_t blocks = (int64_t{context_lens[i]} + block_size_tokens - 1) / block_size_tokens;
      for (size_t j = 0; j < out_cols; ++j) {
        const int64_t col = static_cast<int64_t>(j);
        const bool kept = rows_of[i] >= 0 && col < blocks && col < row_stride;
        out[i * out_cols + j] = kept ? rows[static_cast<size_t>(rows_of[i] * row_stride + col)] : 0;
      }
    }
  }

  void WriteKvCache(const TensorView& k, const TensorView& v, std::span<const int64_t> slots,
                    const TensorView& kv_cache) override {
    const int64_t kv_heads = kv_cache.dim(2);
    const int64_t block_size = kv_cache.dim(3);
    const int64_t d = kv_cache.dim(4);
    const float* ks = k.data_as<const float>();
    const float* vs = v.data_as<const float>();
    // f32 or bf16 (rounded to nearest even) elements.
    const bool bf16 = kv_cache.dtype == DType::kBF16;
    auto store = [&](int64_t index, float x) {
      if (bf16) {
        kv_cache.data_as<uint16_t>()[index] = F32ToBf16(x);
      } else {
        kv_cache.data_as<float>()[index] = x;
      }
    };
    for (size_t t = 0; t < slots.size(); ++t) {
      const int64_t block = slots[t] / block_size;
      const int64_t offset = slots[t] % block_size;
      for (int64_t h = 0; h < kv_heads; ++h) {
        // K: cache[block, 0, h, :, offset] (dimension-major); V: cache[block, 1, h, offset, :].
        const int64_t k_dst = ((block * 2 + 0) * kv_heads + h) * block_size * d + offset;
        const int64_t v_dst = (((block * 2 + 1) * kv_heads + h) * block_size + offset) * d;
        const int64_t src = (static_cast<int64_t>(t) * kv_heads + h) * d;
        for (int64_t c = 0; c < d; ++c) {
          store(k_dst + c * block_size, ks[src + c]);
          store(v_dst + c, vs[src + c]);
        }
      }
    }
  }

  // NOTE: the oracle computes the plain (two-pass, f64) softmax over the whole
  // context; it does not mimic the fast backends' block-tiled online softmax.
  void PagedAttention(const TensorView& q, const TensorView& kv_cache, const PagedAttentionBatch& batch,
                      float scale, const TensorView& out) override {
    const int64_t heads = q.shape[1];
    const int64_t d = q.shape[2];
    const int64_t kv_heads = kv_cache.dim(2);
    const int64_t block_size = kv_cache.dim(3);
    const int64_t group = heads / kv_heads;
    const int64_t num_seqs = static_cast<int64_t>(batch.context_lens.size());
    const float* qs = q.data_as<const float>();
    float* o = out.data_as<float>();
    // Element `index` of the cache, f32 or bf16 widened exactly.
    const bool bf16 = kv_cache.dtype == DType::kBF16;
    auto element = [&](int64_t index) {
      return bf16 ? Bf16ToF32(kv_cache.data_as<const uint16_t>()[index]) : kv_cache.data_as<const float>()[index];
    };
    // Position `p` of sequence `s`, head `h`: the index of its K column (dimension c at
    // + c * block_size) and of its V row (dimension c at + c).
    auto k_column = [&](int64_t s, int64_t p, int64_t h) {
      const int64_t block = batch.block_tables[s * batch.max_blocks_per_seq + p / block_size];
      return ((block * 2 + 0) * kv_heads + h) * block_size * d + p % block_size;
    };
    auto v_row = [&](int64_t s, int64_t p, int64_t h) {
      const int64_t block = batch.block_tables[s * batch.max_blocks_per_seq + p / block_size];
      return (((block * 2 + 1) * kv_heads + h) * block_size + p % block_size) * d;
    };
    std::vector<double> scores;
    std::vector<double> acc(static_cast<size_t>(d));
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t row0 = batch.query_start[s];
      const int64_t n = batch.query_start[s + 1] - row0;
      const int64_t ctx = batch.context_lens[s];
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = row0 + i;
        const int64_t len = ctx - n + i + 1;
        scores.assign(static_cast<size_t>(len), 0.0);
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t kvh = h / group;
          const float* qv = qs + (t * heads + h) * d;
          double max_score = -INFINITY;
          for (int64_t p = 0; p < len; ++p) {
            const int64_t kc = k_column(s, p, kvh);
            double dot = 0.0;
            for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(qv[c]) * element(kc + c * block_size);
            scores[p] = dot * scale;
            if (scores[p] > max_score) max_score = scores[p];
          }
          double denom = 0.0;
          for (int64_t p = 0; p < len; ++p) {
            scores[p] = std::exp(scores[p] - max_score);
            denom += scores[p];
          }
          for (int64_t c = 0; c < d; ++c) acc[c] = 0.0;
          for (int64_t p = 0; p < len; ++p) {
            const int64_t vr = v_row(s, p, kvh);
            for (int64_t c = 0; c < d; ++c) acc[c] += scores[p] * element(vr + c);
          }
          for (int64_t c = 0; c < d; ++c) o[(t * heads + h) * d + c] = static_cast<float>(acc[c] / denom);
        }
      }
    }
  }
};

}  // namespace

std::unique_ptr<Backend> CreateReferenceBackend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace kvmesh::backend
