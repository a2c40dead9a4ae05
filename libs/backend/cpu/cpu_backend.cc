// The CPU backend: picks the AMX, AVX-512 or AVX2 kernel table at creation (cpuid),
// packs linear weights into the panel layout of cpu/kernels.h and forwards
// each op to the table. This file is compiled without ISA flags: it must run
// (and fail cleanly) on any x86-64.
//
// Thread-safety: the backend holds no mutable state after creation but the error
// RecordError keeps (ops.h); its ops may run concurrently on distinct outputs (each call
// opens its own OpenMP team).
#include <cpuid.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/weight_arena.h"
#include "backend/internal/block_pools.h"
#include "backend/internal/linear_parts.h"
#include "backend/ops.h"
#include "core/cpu_quota.h"
#include "core/dtype.h"
#include "core/greedy_argmax.h"
#include "core/tensor_view.h"

namespace kvmesh::backend {
namespace {

// Programmer errors (shapes the engine must have checked): abort with a message.
#define KVMESH_BACKEND_CHECK(cond)                                                          \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: backend check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

// As KVMESH_BACKEND_CHECK, for a check whose Status says what is wrong.
void BackendCheckOk(const absl::Status& status, const char* op) {
  if (status.ok()) return;
  std::fprintf(stderr, "backend check failed: %s: %s\n", op, std::string(status.message()).c_str());
  std::abort();
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<void, FreeDeleter>;

AlignedBuffer AllocateAligned(int64_t bytes) {
  const size_t rounded = static_cast<size_t>((bytes + 63) / 64 * 64);
  return AlignedBuffer(std::aligned_alloc(64, rounded == 0 ? 64 : rounded));
}

// Weight (row, k) of `w` as bf16 bits: bf16 as stored, f32 / f16 rounded to nearest even.
uint16_t Bf16Bits(const TensorView& w, int64_t row, int64_t k) {
  const int64_t i = row * w.strides[0] + k;
  if (w.dtype == DType::kBF16) return static_cast<const uint16_t*>(w.data)[i];
  return F32ToBf16(LoadAsF32(w.data, w.dtype, i));
}

cpu::ElemType ToElemType(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return cpu::ElemType::kBF16;
    case DType::kF16: return cpu::ElemType::kF16;
    default: return cpu::ElemType::kF32;
  }
}

// Below this many elements an op runs on the calling thread: waking the OpenMP team
// (~1 us) costs more than the work (cf. cpu/elementwise_kernels.cc).
constexpr int64_t kMinParallelElements = 1 << 15;

class CpuPackedLinear final : public PackedLinear {
 public:
  CpuPackedLinear(cpu::PackedPanels panels, DType dtype, int64_t num_bytes, cpu::WeightArena::Block data,
                  AlignedBuffer bias)
      : panels_(panels), dtype_(dtype), num_bytes_(num_bytes), data_(std::move(data)), bias_(std::move(bias)) {}

  int64_t out_features() const override { return panels_.n; }
  int64_t in_features() const override { return panels_.k; }
  DType dtype() const override { return dtype_; }
  int64_t num_bytes() const override { return num_bytes_; }
  const cpu::PackedPanels& panels() const { return panels_; }

 private:
  const cpu::PackedPanels panels_;  // points into data_ and bias_
  const DType dtype_;
  const int64_t num_bytes_;
  const cpu::WeightArena::Block data_;
  const AlignedBuffer bias_;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(const cpu::KernelTable& kernels, int num_threads, bool compute_bf16)
      : kernels_(kernels),
        num_threads_(num_threads),
        compute_bf16_(compute_bf16),
        name_(std::string("cpu-") + kernels.isa + (compute_bf16 ? "-bf16" : "")) {}

  std::string_view name() const override { return name_; }
  int num_host_threads() const override { return num_threads_; }

  absl::StatusOr<std::unique_ptr<PackedLinear>> PackLinear(std::span<const TensorView> parts,
                                                           std::span<const TensorView> biases) override {
    absl::StatusOr<internal::LinearPartsInfo> info = internal::ValidateLinearParts(parts, biases);
    if (!info.ok()) return info.status();
    const int64_t n = info->out_features;
    const int64_t k = info->in_features;
    // The bf16 compute mode packs every weight as bf16 (f32 and f16 rounded here).
    const bool bf16 = info->dtype == DType::kBF16 || compute_bf16_;
    // The AMX tile layout (k pairs per column): for AMX, and for VDPBF16PS in the bf16 mode.
    const bool amx = bf16 && (kernels_.amx_bf16 || (compute_bf16_ && kernels_.bf16_pairs_in_compute_mode));
    const int64_t num_panels = (n + cpu::kPanelCols - 1) / cpu::kPanelCols;
    const int64_t elem_bytes = bf16 ? 2 : 4;
    // AMX panels pad K with zeros to whole 32-k blocks (cpu/kernels.h).
    const int64_t kp = amx ? (k + cpu::kAmxK - 1) / cpu::kAmxK * cpu::kAmxK : k;
    const int64_t panel_elems = kp * cpu::kPanelCols;
    cpu::WeightArena::Block data = weights_.Allocate(num_panels * panel_elems * elem_bytes);
    if (!data) return absl::ResourceExhaustedError("PackLinear: out of memory");

    // Row r of the fused weight -> (part, row within part).
    std::vector<std::pair<const TensorView*, int64_t>> rows(static_cast<size_t>(n));
    {
      int64_t r = 0;
      for (const TensorView& w : parts) {
        for (int64_t i = 0; i < w.shape[0]; ++i) rows[r++] = {&w, i};
      }
    }
#pragma omp parallel for num_threads(num_threads_)
    for (int64_t p = 0; p < num_panels; ++p) {
      for (int col = 0; col < cpu::kPanelCols; ++col) {
        const int64_t row = p * cpu::kPanelCols + col;
        const TensorView* w = row < n ? rows[row].first : nullptr;
        const int64_t src_row = row < n ? rows[row].second : 0;
        if (amx) {
          // Block kb of 32 k: tile (col / 16), row (k % 32) / 2, pair slot col % 16, half k % 2.
          uint16_t* dst = reinterpret_cast<uint16_t*>(data.data()) + p * panel_elems + (col / 16) * 512 + (col % 16) * 2;
          for (int64_t kk = 0; kk < kp; ++kk) {
            dst[(kk / 32) * 1024 + ((kk % 32) / 2) * 32 + kk % 2] = w && kk < k ? Bf16Bits(*w, src_row, kk) : 0;
          }
        } else if (bf16) {
          // dword j of a k-row = (column j, column 16 + j): see cpu/kernels.h.
          uint16_t* dst = reinterpret_cast<uint16_t*>(data.data()) + p * panel_elems;
          const int slot = col < 16 ? 2 * col : 2 * (col - 16) + 1;
          for (int64_t kk = 0; kk < k; ++kk) dst[kk * cpu::kPanelCols + slot] = w ? Bf16Bits(*w, src_row, kk) : 0;
        } else {
          float* dst = reinterpret_cast<float*>(data.data()) + p * panel_elems;
          for (int64_t kk = 0; kk < k; ++kk) {
            dst[kk * cpu::kPanelCols + col] = w ? LoadAsF32(w->data, w->dtype, src_row * w->strides[0] + kk) : 0.0f;
          }
        }
      }
    }
    AlignedBuffer bias;
    if (!biases.empty()) {
      bias = AllocateAligned(num_panels * cpu::kPanelCols * 4);
      float* b = static_cast<float*>(bias.get());
      int64_t row = 0;
      for (const TensorView& bv : biases) {
        for (int64_t i = 0; i < bv.num_elements(); ++i) b[row++] = LoadAsF32(bv.data, bv.dtype, i);
      }
      for (; row < num_panels * cpu::kPanelCols; ++row) b[row] = 0.0f;
    }
    cpu::PackedPanels panels = {
        .data = data.data(),
        .type = amx ? cpu::ElemType::kBF16Amx : bf16 ? cpu::ElemType::kBF16 : cpu::ElemType::kF32,
        .n = n,
        .k = k,
        .num_panels = num_panels,
        .bias = static_cast<const float*>(bias.get()),
    };
    const int64_t num_bytes = num_panels * panel_elems * elem_bytes + (biases.empty() ? 0 : n * 4);
    return std::unique_ptr<PackedLinear>(new CpuPackedLinear(panels, bf16 ? DType::kBF16 : DType::kF32, num_bytes,
                                                             std::move(data), std::move(bias)));
  }

  void Linear(const TensorView& x, const PackedLinear& packed, const TensorView& out) override {
    const auto& w = static_cast<const CpuPackedLinear&>(packed);
    KVMESH_BACKEND_CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32);
    KVMESH_BACKEND_CHECK(x.dim(-1) == w.in_features() && out.dim(-1) == w.out_features());
    const int64_t m = x.num_elements() / w.in_features();
    KVMESH_BACKEND_CHECK(out.num_elements() == m * w.out_features());
    (compute_bf16_ ? kernels_.linear_bf16 : kernels_.linear)(x.data_as<const float>(), m, w.panels(),
                                                             out.data_as<float>(), num_threads_);
  }

  void Embedding(std::span<const int32_t> ids, const TensorView& table, const TensorView& out) override {
    KVMESH_BACKEND_CHECK(table.rank == 2 && table.strides[1] == 1);
    KVMESH_BACKEND_CHECK(out.num_elements() == static_cast<int64_t>(ids.size()) * table.shape[1]);
    kernels_.embedding(ids.data(), static_cast<int64_t>(ids.size()), table.data, ToElemType(table.dtype),
                       table.strides[0], table.shape[1], out.data_as<float>(), num_threads_);
  }

  // The shard's rows go through the embedding kernel in one call (another rank's ids read
  // row 0 there), then those other ranks' rows are zeroed.
  void EmbeddingShard(std::span<const int32_t> ids, const TensorView& table, int64_t first_id,
                      const TensorView& out) override {
    KVMESH_BACKEND_CHECK(table.rank == 2 && table.strides[1] == 1 && first_id >= 0);
    KVMESH_BACKEND_CHECK(out.dtype == DType::kF32 && out.is_contiguous());
    const int64_t v = table.shape[0];
    const int64_t e = table.shape[1];
    const int64_t t = static_cast<int64_t>(ids.size());
    KVMESH_BACKEND_CHECK(out.num_elements() == t * e);
    std::vector<int32_t> rows(ids.size());
    bool any_in_shard = false;
    for (int64_t i = 0; i < t; ++i) {
      KVMESH_BACKEND_CHECK(ids[i] >= 0);
      const int64_t row = ids[i] - first_id;
      const bool in_shard = row >= 0 && row < v;
      rows[i] = in_shard ? static_cast<int32_t>(row) : 0;
      any_in_shard |= in_shard;
    }
    float* o = out.data_as<float>();
    if (any_in_shard) {
      kernels_.embedding(rows.data(), t, table.data, ToElemType(table.dtype), table.strides[0], e, o, num_threads_);
    }
    for (int64_t i = 0; i < t; ++i) {
      const int64_t row = ids[i] - first_id;
      if (row < 0 || row >= v) std::memset(o + i * e, 0, static_cast<size_t>(e) * sizeof(float));
    }
  }

  void RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) override {
    const int64_t e = x.dim(-1);
    KVMESH_BACKEND_CHECK(weight.num_elements() == e && out.num_elements() == x.num_elements());
    kernels_.rms_norm(nullptr, x.data_as<const float>(), x.num_elements() / e, e, weight.data,
                      ToElemType(weight.dtype), eps, out.data_as<float>(), num_threads_);
  }

  void AddRmsNorm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                  const TensorView& out) override {
    const int64_t e = x.dim(-1);
    KVMESH_BACKEND_CHECK(weight.num_elements() == e && residual.num_elements() == x.num_elements());
    kernels_.rms_norm(residual.data_as<float>(), x.data_as<const float>(), x.num_elements() / e, e, weight.data,
                      ToElemType(weight.dtype), eps, out.data_as<float>(), num_threads_);
  }

  void ApplyRope(const TensorView& q, const TensorView& k, std::span<const int32_t> positions,
                 std::span<const float> inv_freq) override {
    KVMESH_BACKEND_CHECK(q.rank == 3 && k.rank == 3 && q.shape[2] == k.shape[2]);
    KVMESH_BACKEND_CHECK(static_cast<int64_t>(inv_freq.size()) * 2 == q.shape[2]);
    KVMESH_BACKEND_CHECK(static_cast<int64_t>(positions.size()) == q.shape[0] && k.shape[0] == q.shape[0]);
    kernels_.rope(q.data_as<float>(), k.data_as<float>(), q.shape[0], q.shape[1], k.shape[1], q.shape[2],
                  positions.data(), inv_freq.data(), num_threads_);
  }

  void SiluAndMul(const TensorView& gate_up, const TensorView& out) override {
    const int64_t inter = out.dim(-1);
    KVMESH_BACKEND_CHECK(gate_up.dim(-1) == 2 * inter);
    kernels_.silu_and_mul(gate_up.data_as<const float>(), out.num_elements() / inter, inter, out.data_as<float>(),
                          num_threads_);
  }

  void DenseAttention(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                      std::span<const int32_t> positions, float scale, const TensorView& out) override {
    KVMESH_BACKEND_CHECK(q.rank == 3 && k_cache.rank == 3 && v_cache.rank == 3);
    const int64_t t = q.shape[0];
    const int64_t h = q.shape[1];
    const int64_t d = q.shape[2];
    const int64_t hkv = k_cache.shape[1];
    KVMESH_BACKEND_CHECK(hkv > 0 && h % hkv == 0 && k_cache.shape[2] == d && d <= 512);
    KVMESH_BACKEND_CHECK(static_cast<int64_t>(positions.size()) == t);
    if (t == 0) return;
    kernels_.dense_attention(q.data_as<const float>(), k_cache.data_as<const float>(), v_cache.data_as<const float>(),
                             t, h, hkv, d, positions.data(), scale, out.data_as<float>(), num_threads_);
  }

  void CopyColumns(const TensorView& src, int64_t src_col, const TensorView& dst, int64_t dst_col,
                   int64_t width) override {
    KVMESH_BACKEND_CHECK(src.rank == 2 && dst.rank == 2 && src.dtype == DType::kF32 && dst.dtype == DType::kF32);
    KVMESH_BACKEND_CHECK(src.is_contiguous() && dst.is_contiguous() && src.shape[0] == dst.shape[0]);
    const int64_t t = src.shape[0];
    const int64_t ns = src.shape[1];
    const int64_t nd = dst.shape[1];
    KVMESH_BACKEND_CHECK(width >= 0 && src_col >= 0 && dst_col >= 0);
    KVMESH_BACKEND_CHECK(src_col + width <= ns && dst_col + width <= nd);
    if (width == 0) return;
    const float* s = src.data_as<const float>() + src_col;
    float* d = dst.data_as<float>() + dst_col;
#pragma omp parallel for num_threads(ThreadsFor(t * width))
    for (int64_t r = 0; r < t; ++r) {
      std::memcpy(d + r * nd, s + r * ns, static_cast<size_t>(width) * sizeof(float));
    }
  }

  void GatherAddRows(const TensorView& a, const TensorView& b, std::span<const int32_t> rows,
                     const TensorView& out) override {
    KVMESH_BACKEND_CHECK(a.rank == 2 && a.shape == b.shape && out.rank == 2 && out.shape[1] == a.shape[1]);
    KVMESH_BACKEND_CHECK(a.dtype == DType::kF32 && b.dtype == DType::kF32 && out.dtype == DType::kF32);
    KVMESH_BACKEND_CHECK(a.is_contiguous() && b.is_contiguous() && out.is_contiguous());
    const int64_t t = a.shape[0];
    const int64_t e = a.shape[1];
    const int64_t r_count = static_cast<int64_t>(rows.size());
    KVMESH_BACKEND_CHECK(out.shape[0] == r_count);
    for (int32_t row : rows) KVMESH_BACKEND_CHECK(row >= 0 && row < t);
    const float* as = a.data_as<const float>();
    const float* bs = b.data_as<const float>();
    float* o = out.data_as<float>();
#pragma omp parallel for num_threads(ThreadsFor(r_count * e))
    for (int64_t i = 0; i < r_count; ++i) {
      const float* ar = as + rows[i] * e;
      const float* br = bs + rows[i] * e;
      float* orow = o + i * e;
      for (int64_t c = 0; c < e; ++c) orow[c] = ar[c] + br[c];
    }
  }

  void ArgmaxRows(const TensorView& x, std::span<int32_t> out) override {
    KVMESH_BACKEND_CHECK(x.rank == 2 && x.dtype == DType::kF32 && x.is_contiguous());
    const int64_t r_count = x.shape[0];
    const int64_t v = x.shape[1];
    KVMESH_BACKEND_CHECK(static_cast<int64_t>(out.size()) == r_count && v >= 1 && v <= INT32_MAX);
    const float* xs = x.data_as<const float>();
#pragma omp parallel for num_threads(ThreadsFor(r_count * v))
    for (int64_t r = 0; r < r_count; ++r) out[r] = GreedyToken(xs + r * v, static_cast<int32_t>(v));
  }

  void CopyBlocks(const BlockPool& pool, std::span<const int32_t> pairs) override {
    CopyBlockPairs(pool, pool, pairs, "CopyBlocks");
  }

  void SwapBlocks(const BlockPool& src, const BlockPool& dst, std::span<const int32_t> pairs) override {
    CopyBlockPairs(src, dst, pairs, "SwapBlocks");
  }

  void ScatterPairs(std::span<const int32_t> updates, std::span<int32_t> array) override {
    KVMESH_BACKEND_CHECK(updates.size() % 2 == 0);
    const int64_t size = static_cast<int64_t>(array.size());
    for (size_t i = 0; i < updates.size(); i += 2) {
      KVMESH_BACKEND_CHECK(updates[i] >= 0 && updates[i] < size);
      array[static_cast<size_t>(updates[i])] = updates[i + 1];
    }
  }

  // Row i of out: the first n_i entries of its kept row (one memcpy), then zeros.
  void GatherTableRows(std::span<const int32_t> rows, int64_t row_stride, std::span<const int32_t> rows_of,
                       std::span<const int32_t> context_lens, int32_t block_size_tokens,
                       std::span<int32_t> out) override {
    const int64_t s = static_cast<int64_t>(rows_of.size());
    KVMESH_BACKEND_CHECK(s >= 1 && static_cast<int64_t>(context_lens.size()) == s);
    KVMESH_BACKEND_CHECK(static_cast<int64_t>(out.size()) % s == 0);
    KVMESH_BACKEND_CHECK(row_stride >= 1 && block_size_tokens >= 1);
    const int64_t out_cols = static_cast<int64_t>(out.size()) / s;
    const int64_t width = std::min(out_cols, row_stride);
    for (int64_t i = 0; i < s; ++i) {
      const int64_t blocks = (int64_t{context_lens[i]} + block_size_tokens - 1) / block_size_tokens;
      const int64_t n = rows_of[i] < 0 ? 0 : std::clamp<int64_t>(blocks, 0, width);
      int32_t* row = out.data() + i * out_cols;
      if (n > 0) {
        const int64_t begin = int64_t{rows_of[i]} * row_stride;
        KVMESH_BACKEND_CHECK(begin + n <= static_cast<int64_t>(rows.size()));
        std::memcpy(row, rows.data() + begin, static_cast<size_t>(n) * sizeof(int32_t));
      }
      std::fill(row + n, row + out_cols, 0);
    }
  }

  void WriteKvCache(const TensorView& k, const TensorView& v, std::span<const int64_t> slots,
                    const TensorView& kv_cache) override {
    KVMESH_BACKEND_CHECK(k.rank == 3 && v.rank == 3 && kv_cache.rank == 5 && kv_cache.shape[1] == 2);
    KVMESH_BACKEND_CHECK(k.dtype == DType::kF32 && v.dtype == DType::kF32 &&
                         (kv_cache.dtype == DType::kF32 || kv_cache.dtype == DType::kBF16));
    const int64_t hkv = kv_cache.shape[2];
    const int64_t d = kv_cache.shape[4];
    KVMESH_BACKEND_CHECK(k.shape == v.shape && k.shape[1] == hkv && k.shape[2] == d);
    KVMESH_BACKEND_CHECK(static_cast<int64_t>(slots.size()) == k.shape[0]);
    if (slots.empty()) return;
    kernels_.write_kv_cache(k.data_as<const float>(), v.data_as<const float>(), k.shape[0], slots.data(),
                            kv_cache.data, kv_cache.dtype == DType::kBF16, hkv, kv_cache.shape[3], d, num_threads_);
  }

  void PagedAttention(const TensorView& q, const TensorView& kv_cache, const PagedAttentionBatch& batch, float scale,
                      const TensorView& out) override {
    KVMESH_BACKEND_CHECK(q.rank == 3 && kv_cache.rank == 5 && kv_cache.shape[1] == 2);
    KVMESH_BACKEND_CHECK(q.dtype == DType::kF32 && out.dtype == DType::kF32 &&
                         (kv_cache.dtype == DType::kF32 || kv_cache.dtype == DType::kBF16));
    const int64_t h = q.shape[1];
    const int64_t d = q.shape[2];
    const int64_t hkv = kv_cache.shape[2];
    KVMESH_BACKEND_CHECK(hkv > 0 && h % hkv == 0 && kv_cache.shape[4] == d && d > 0 && d % 16 == 0);
    KVMESH_BACKEND_CHECK(out.num_elements() == q.num_elements());
    const int64_t num_seqs = static_cast<int64_t>(batch.context_lens.size());
    KVMESH_BACKEND_CHECK(static_cast<int64_t>(batch.query_start.size()) == num_seqs + 1);
    KVMESH_BACKEND_CHECK(static_cast<int64_t>(batch.block_tables.size()) >= num_seqs * batch.max_blocks_per_seq);
    if (num_seqs == 0) return;
    KVMESH_BACKEND_CHECK(batch.query_start[0] == 0 && batch.query_start[num_seqs] == q.shape[0]);
    const cpu::PagedAttentionParams params = {
        .q = q.data_as<const float>(),
        .kv_cache = kv_cache.data,
        .kv_bf16 = kv_cache.dtype == DType::kBF16,
        .query_start = batch.query_start.data(),
        .context_lens = batch.context_lens.data(),
        .block_tables = batch.block_tables.data(),
        .num_seqs = num_seqs,
        .max_blocks_per_seq = batch.max_blocks_per_seq,
        .h = h,
        .hkv = hkv,
        .d = d,
        .block_size = kv_cache.shape[3],
        .scale = scale,
        .out = out.data_as<float>(),
    };
    kernels_.paged_attention(params, num_threads_);
  }

 private:
  int ThreadsFor(int64_t elements) const { return elements < kMinParallelElements ? 1 : num_threads_; }

  // ops.h CopyBlocks and SwapBlocks (`op` names which): one memcpy per (pair, layer). The
  // team shares the (pair, layer) copies once they add up to enough bytes, so that one
  // block of many layers spreads as well as many blocks do.
  void CopyBlockPairs(const BlockPool& src, const BlockPool& dst, std::span<const int32_t> pairs, const char* op) {
    KVMESH_BACKEND_CHECK(pairs.size() % 2 == 0);
    if (pairs.empty()) return;
    BackendCheckOk(internal::CheckBlockCopy(src, dst, pairs), op);
    const int64_t n = static_cast<int64_t>(pairs.size()) / 2;
    const int64_t layers = src.num_layers;
    const int64_t block_bytes = src.block_bytes;
    // ThreadsFor counts f32 elements: the bytes moved, as floats.
#pragma omp parallel for collapse(2) num_threads(ThreadsFor(n * layers * block_bytes / int64_t{sizeof(float)}))
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t layer = 0; layer < layers; ++layer) {
        const std::byte* from = src.data + layer * src.layer_bytes + int64_t{pairs[2 * i]} * block_bytes;
        std::byte* to = dst.data + layer * dst.layer_bytes + int64_t{pairs[2 * i + 1]} * block_bytes;
        if (from != to) std::memcpy(to, from, static_cast<size_t>(block_bytes));  // (b, b): a no-op
      }
    }
  }

  const cpu::KernelTable& kernels_;
  const int num_threads_;
  const bool compute_bf16_;  // CpuBackendOptions::compute_dtype == kBF16
  const std::string name_;
  cpu::WeightArena weights_;  // the packed weights (their blocks keep its chunks alive)
};

bool HasAvx2() {
  __builtin_cpu_init();
  // NOTE: F16C from CPUID (leaf 1, ECX bit 29): clang 14 (the fuzz build, tools/fuzz)
  // does not know "f16c" as a __builtin_cpu_supports feature.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

bool HasAvx512() {
  __builtin_cpu_init();
  return HasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

bool IsAmd() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return false;
  return ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;  // "AuthenticAMD"
}

// AVX-512 and cpuid AVX512_BF16 (leaf 7, subleaf 1, EAX bit 5): VDPBF16PS.
bool HasAvx512Bf16() {
  if (!HasAvx512()) return false;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && ((eax >> 5) & 1u) != 0;
}

// AVX-512, cpuid AMX-TILE and AMX-BF16, and the kernel's permission to use
// tile data (Linux >= 5.16: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA),
// process-wide, asked once). False on any failure, so the AVX-512 table runs.
bool HasAmx() {
  static const bool has_amx = [] {
    if (!HasAvx512()) return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool amx_bf16 = (edx >> 22) & 1u;
    const bool amx_tile = (edx >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return has_amx;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& given) {
  CpuBackendOptions options = given;
  // KVMESH_CPU_ISA=amx|avx512|avx2 overrides "auto" (A/B runs of the whole
  // server, e.g. the AVX-512 path on an AMX machine).
  if (options.isa == "auto") {
    if (const char* env = std::getenv("KVMESH_CPU_ISA"); env != nullptr && env[0] != '\0') options.isa = env;
  }
  if (options.compute_dtype != DType::kF32 && options.compute_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("CreateCpuBackend: compute_dtype must be f32 or bf16, not ",
                                                   std::string(DTypeName(options.compute_dtype))));
  }
  const cpu::KernelTable* kernels = nullptr;
  if (options.isa == "auto") {
    if (HasAmx()) {
      kernels = &cpu::AmxKernels();
    } else if (HasAvx512()) {
      kernels = &cpu::Avx512Kernels();
    } else if (HasAvx2()) {
      kernels = &cpu::Avx2Kernels();
    }
  } else if (options.isa == "avx512") {
    if (HasAvx512()) kernels = &cpu::Avx512Kernels();
  } else if (options.isa == "avx2") {
    if (HasAvx2()) kernels = &cpu::Avx2Kernels();
  } else if (options.isa == "amx") {
    if (HasAmx()) kernels = &cpu::AmxKernels();
  } else if (options.isa == "avx512bf16") {
    if (HasAvx512Bf16()) kernels = &cpu::Avx512Bf16Kernels();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateCpuBackend: unknown isa \"", absl::string_view(options.isa.data(), options.isa.size()),
                     "\" (want auto, amx, avx512, avx512bf16 or avx2)"));
  }
  if (kernels == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CreateCpuBackend: this CPU lacks ",
        options.isa == "avx512"       ? "AVX-512 (F/BW/VL/DQ)"
        : options.isa == "avx512bf16" ? "AVX-512 + AVX512_BF16"
        : options.isa == "amx"  ? "AVX-512 + AMX-BF16 (or the kernel denied AMX tile data)"
                                : "AVX2+FMA+F16C"));
  }
  // The bf16 compute mode on AVX-512 without AMX: VDPBF16PS on AMD only. Intel issues
  // it on one port, at the f32 FMA's rate of products: measured 0.6x of the FMA path
  // on Sapphire Rapids (backend_bench --isa avx512bf16, bf16c column); Zen 4 issues
  // it at its FMA rate with twice the products per instruction.
  if (options.isa == "auto" && options.compute_dtype == DType::kBF16 && kernels == &cpu::Avx512Kernels() &&
      HasAvx512Bf16() && IsAmd()) {
    kernels = &cpu::Avx512Bf16Kernels();
  }
  // Default: the CPUs this process can keep busy (its cgroup quota caps the affinity
  // mask, core/cpu_quota.h), not OpenMP's default of every CPU in the mask.
  const int threads = options.num_threads > 0 ? options.num_threads : UsableCpus();
  omp_set_num_threads(threads);
  return std::unique_ptr<Backend>(new CpuBackend(*kernels, threads, options.compute_dtype == DType::kBF16));
}

}  // namespace kvmesh::backend
