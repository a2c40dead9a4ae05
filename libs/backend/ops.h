// The backend interface: every numeric operation the engine runs, implemented
// by reference/ (scalar oracle), cpu/ (AVX-512/AVX2 + OpenMP) and cuda/ (kernels/
// and cuBLAS on one stream).
//
// Conventions for all ops:
//  - Activations are f32, contiguous, row-major, in the backend's memory
//    (uses_host_memory(): host for reference/cpu, device for cuda).
//  - Weights arrive as TensorViews over the model's storage (f32, bf16 or f16),
//    in Hugging Face layout; a backend may repack them once (PackLinear).
//  - Shapes are given outermost first; T = tokens in the batch, H = query heads,
//    Hkv = KV heads, D = head_dim, S = cached positions.
//
// Error contract (one for every op and every backend):
//  1. Preconditions written on an op (shapes, dtypes, index ranges) are the
//     caller's to keep: the engine validates requests and batches before it calls
//     in (engine/step_metadata.h). Breaking one is a programmer error; a backend
//     that can check it on the host stops the process with the failed check (cpu),
//     and never reads or writes out of bounds silently where it checks.
//  2. Failures that well-formed arguments can still meet at run time (a device
//     launch or allocation failing) never abort: the backend keeps the FIRST such
//     error, skips the ops after it, and TakeError() returns and clears it. Every
//     runner calls TakeError() once per step, after its last op and before it reads
//     any result, and fails the step with that status. Host backends' own ops never
//     have such failures: their TakeError() returns only what RecordError kept.
//  3. Ops that return a Status (PackLinear) report their errors there instead.
//
// Ordering contract: ops run in call order. Host backends finish each op before it
// returns; a device backend may only enqueue it on its one stream, so the caller
// must synchronize (its runner does) before reading device results on the host.
//
// Thread-safety: a Backend is driven by one thread at a time (the engine loop, or
// one tensor-parallel rank's thread with a backend of its own); its ops may use a
// team of worker threads internally. PackedLinear objects are immutable once packed
// and may be read by any thread.
//
// The engine never includes a backend's own headers: it holds a Backend&.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor_view.h"

namespace kvmesh::backend {

// A linear layer's weight in whatever layout the backend computes fastest with.
// Owned by the caller of PackLinear; the source TensorViews need not outlive it.
class PackedLinear {
 public:
  virtual ~PackedLinear() = default;
  virtual int64_t out_features() const = 0;
  virtual int64_t in_features() const = 0;
  // Storage type of the packed weight (bf16 stays bf16; f16 may be widened).
  virtual DType dtype() const = 0;
  // Bytes one full pass over the weight (and bias) reads: the roofline's numerator.
  virtual int64_t num_bytes() const = 0;
};

// One batch of sequences for PagedAttention. Sequence s owns query rows
// query_start[s] .. query_start[s+1]-1 of q (n_s rows: a prefill chunk, or 1 for a
// decode step); they are the LAST n_s positions of its context of context_lens[s]
// tokens, so query row i of s sits at position context_lens[s] - n_s + i and attends
// causally to positions 0..that. Position p's K/V lives in block
// block_tables[s * max_blocks_per_seq + p / B] at offset p % B.
struct PagedAttentionBatch {
  std::span<const int32_t> query_start;   // [S + 1], query_start[0] == 0, ascending
  std::span<const int32_t> context_lens;  // [S], >= n_s
  std::span<const int32_t> block_tables;  // [S, max_blocks_per_seq], row-major
  int32_t max_blocks_per_seq = 0;
  // Host-known upper bounds on every n_s and context_lens[s]. A backend whose spans
  // point to device memory (cuda: it cannot read them) sizes its launch by these and
  // needs them > 0; host backends read the spans and ignore them (0: not given).
  int32_t max_query_len = 0;
  int32_t max_context_len = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Whether the ops take host memory (the CPU backends) or device memory (cuda). The
  // host-side runners (LlamaModel::Forward, PagedModelRunner) need host memory.
  virtual bool uses_host_memory() const { return true; }
  // Host threads the ops run on (the CPU backends' OpenMP team), which a runner may also
  // use for host work between ops (KV copies to and from the host tier); 1 for a device
  // backend, whose ops leave the host thread free.
  virtual int num_host_threads() const { return 1; }

  // The first run-time failure since the last call (clause 2 of the error contract),
  // and clears it; OK if none. Host backends: always OK.
  virtual absl::Status TakeError() { return std::exchange(recorded_, absl::OkStatus()); }

  // Packs one linear layer from `parts` concatenated along the output dimension
  // (e.g. q/k/v or gate/up fused into one GEMM). parts[i]: [N_i, K], all the same
  // K and dtype (f32, bf16 or f16). `biases` is empty or holds one [N_i] view per
  // part (any float dtype). InvalidArgument on mismatched shapes or dtypes.
  virtual absl::StatusOr<std::unique_ptr<PackedLinear>> PackLinear(
      std::span<const TensorView> parts, std::span<const TensorView> biases) = 0;

  // out[t, n] = sum_k x[t, k] * W[n, k] (+ bias[n]), accumulated in f32.
  // x: [T, K] f32; out: [T, N] f32.
  virtual void Linear(const TensorView& x, const PackedLinear& w, const TensorView& out) = 0;

  // out[t, :] = table[ids[t], :] widened to f32. table: [V, E]; out: [T, E]. ids in [0, V).
  virtual void Embedding(std::span<const int32_t> ids, const TensorView& table, const TensorView& out) = 0;

  // A vocab-parallel shard's lookup: table holds rows for ids first_id .. first_id+V-1;
  // out[t, :] = table[ids[t] - first_id, :] widened to f32 where ids[t] is in that range,
  // else zeros (another rank's row: the all-reduce that follows adds exactly one row).
  // table: [V, E]; out: [T, E]; ids >= 0, first_id >= 0.
  virtual void EmbeddingShard(std::span<const int32_t> ids, const TensorView& table, int64_t first_id,
                              const TensorView& out) = 0;

  // out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight. x, out: [T, E] f32
  // (may alias); weight: [E] any float dtype.
  virtual void RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) = 0;

  // residual += x; out = RmsNorm(residual). residual, x, out: [T, E] f32.
  virtual void AddRmsNorm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                          const TensorView& out) = 0;

  // Rotates q: [T, H, D] and k: [T, Hkv, D] in place, Hugging Face "rotate_half"
  // style: pairs (i, i + D/2) rotated by angle positions[t] * inv_freq[i].
  // inv_freq: [D/2] (any RoPE scaling already applied); the angle and its cos/sin
  // are computed in f32 as transformers does.
  virtual void ApplyRope(const TensorView& q, const TensorView& k, std::span<const int32_t> positions,
                         std::span<const float> inv_freq) = 0;

  // out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i]. gate_up: [T, 2I]; out: [T, I].
  virtual void SiluAndMul(const TensorView& gate_up, const TensorView& out) = 0;

  // Causal grouped-query attention over one sequence's dense KV cache.
  // q: [T, H, D]; k_cache, v_cache: [S, Hkv, D] f32 holding positions 0..S-1;
  // token t attends to cache positions 0..positions[t] (positions[t] < S);
  // query head h reads KV head h / (H / Hkv). out: [T, H, D].
  virtual void DenseAttention(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                              std::span<const int32_t> positions, float scale, const TensorView& out) = 0;

  // --- Data movement the forward pass needs between ops (each a plain copy or sum: the
  // bits are the inputs' on every backend).

  // dst[t, dst_col + j] = src[t, src_col + j] for j < width and every row t.
  // src: [T, Ns], dst: [T, Nd] f32, both 2-D contiguous with the same T;
  // src_col + width <= Ns, dst_col + width <= Nd; src and dst do not overlap.
  virtual void CopyColumns(const TensorView& src, int64_t src_col, const TensorView& dst, int64_t dst_col,
                           int64_t width) = 0;

  // out[i, :] = a[rows[i], :] + b[rows[i], :]. a, b: [T, E] f32; out: [R, E] f32 with
  // R == rows.size(); rows in [0, T).
  virtual void GatherAddRows(const TensorView& a, const TensorView& b, std::span<const int32_t> rows,
                             const TensorView& out) = 0;

  // out[i] = the lowest index of the largest value of row i, reading each value as the
  // host sampler's greedy path does (engine/sampler.cc): NaN never wins, +inf counts as
  // the largest finite float; -1 when every value of the row is NaN or -inf (where the
  // sampler finds no finite logit).
  // x: [R, V] f32; out: [R] with R == out.size(), V >= 1.
  virtual void ArgmaxRows(const TensorView& x, std::span<int32_t> out) = 0;

  // --- Memory. A buffer in the memory the ops take (host, or the device for cuda), for
  // activations, logits and KV pools. Allocate is synchronous and never leaves a sticky
  // error: ResourceExhausted (naming `what`) when the memory is not there. Host backends
  // align it to 64 bytes.
  class Buffer {
   public:
    virtual ~Buffer() = default;
    virtual std::byte* data() const = 0;
    virtual int64_t size_bytes() const = 0;
    template <typename T>
    T* as() const {
      return reinterpret_cast<T*>(data());
    }
  };
  virtual absl::StatusOr<std::unique_ptr<Buffer>> Allocate(int64_t bytes, std::string_view what);

  // --- Ordering and workspace, for a runner's own work beside the ops.

  // The queue the ops are ordered on, for work a runner orders with them (its uploads
  // from pinned staging, graph capture): the cudaStream_t for cuda; nullptr for host
  // backends, whose ops are done when they return.
  virtual void* queue() const { return nullptr; }
  // Records a failure of the caller's own work on queue() under clause 2 of the error
  // contract: kept if no failure is yet, returned by the next TakeError(). `status` is
  // not OK. Host backends keep it too (their own ops never fail).
  virtual void RecordError(absl::Status status) {
    if (recorded_.ok()) recorded_ = std::move(status);
  }
  // The largest work the ops will be given, so that a backend that grows scratch on
  // first use (cuda: GEMM operand casts, split-K partials) sizes it now and no op
  // allocates later (inside a graph capture). Host backends: nothing to do.
  struct WorkspaceLimits {
    int64_t max_tokens = 0;      // rows of any activation
    int64_t max_width = 0;       // widest Linear input (K)
    int64_t max_seqs = 0;        // decode rows of one PagedAttention
    int32_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
    int32_t max_context_len = 0;
  };
  virtual absl::Status ReserveWorkspace(const WorkspaceLimits& limits) { return absl::OkStatus(); }

  // --- Whole KV blocks. A pool is layer-major as kv/kv_layout.h lays it out:
  // num_layers layers of layer_bytes each, block b of a layer at b * block_bytes. A
  // host-tier slot (every layer of one block) is a pool with layer_bytes == block_bytes.
  struct BlockPool {
    std::byte* data = nullptr;
    int64_t num_layers = 0;
    int64_t layer_bytes = 0;
    int64_t block_bytes = 0;
  };

  // For each (src, dst) pair of `pairs` ([n, 2] int32, backend memory), copies block src
  // of every layer onto block dst, byte for byte. Ids in [0, layer_bytes / block_bytes);
  // a block is the dst of at most one pair and never also a src (the pairs run in no
  // particular order).
  virtual void CopyBlocks(const BlockPool& pool, std::span<const int32_t> pairs) = 0;

  // The same between two pools with the same num_layers and block_bytes (layer_bytes may
  // differ): block src of `src` onto block dst of `dst`, every layer. One pool is the
  // backend's memory, the other host memory (an offload or an onboard), or both the
  // backend's. `pairs` is host memory, read by the backend in place (cuda: pinned or
  // registered host memory) until the op has run. Ids as for CopyBlocks, each side in
  // its own pool's range.
  virtual void SwapBlocks(const BlockPool& src, const BlockPool& dst, std::span<const int32_t> pairs) = 0;

  // --- Kept block tables (engine/block_tables.h): a runner keeps every running
  // sequence's table as a row of one int32 array in the backend's memory, updates the
  // entries that changed and gathers each step's table from it.

  // array[updates[2i]] = updates[2i + 1] for every pair. updates: [n, 2] int32, backend
  // memory, with distinct indices, each inside `array` (backend memory).
  virtual void ScatterPairs(std::span<const int32_t> updates, std::span<int32_t> array) = 0;

  // out[i, j] = rows[rows_of[i] * row_stride + j] for j < min(ceil(context_lens[i] /
  // block_size_tokens), out_cols, row_stride) when rows_of[i] >= 0; else 0.
  // rows: [*, row_stride]; rows_of, context_lens: [S]; out: [S, out_cols] (out_cols =
  // out.size() / S, S >= 1); row_stride, block_size_tokens >= 1; all int32 in
  // backend memory. Graph-capturable on cuda: sized by the spans' lengths, the values
  // read at run time.
  virtual void GatherTableRows(std::span<const int32_t> rows, int64_t row_stride, std::span<const int32_t> rows_of,
                               std::span<const int32_t> context_lens, int32_t block_size_tokens,
                               std::span<int32_t> out) = 0;

  // --- Paged KV (docs/architecture.md §2). One layer's cache is kv_cache:
  // [num_blocks, 2 (K, V), Hkv, B, D], each block contiguous (kv/kv_layout.h); K of a
  // block head is stored [D][B] and V [B][D] (kv_layout.h). Element type f32 or bf16
  // on every backend (cuda also fp8 e4m3); K/V are written rounded to it and widened
  // exactly to f32 when read.

  // Writes token t's key and value into cache slot slots[t] (= block * B + offset).
  // k, v: [T, Hkv, D] f32; slots: [T], each < num_blocks * B.
  virtual void WriteKvCache(const TensorView& k, const TensorView& v, std::span<const int64_t> slots,
                            const TensorView& kv_cache) = 0;

  // Causal grouped-query attention over paged KV for a mixed batch of prefill
  // chunks and decode steps. q: [T, H, D] f32 with T == query_start[S]; out: [T, H, D].
  // The softmax is accumulated online over KV tiles aligned to block boundaries, in
  // position order, so a token's result does not depend on the batch it is in or on
  // how its prompt was chunked.
  virtual void PagedAttention(const TensorView& q, const TensorView& kv_cache, const PagedAttentionBatch& batch,
                              float scale, const TensorView& out) = 0;

 private:
  absl::Status recorded_;  // the default RecordError / TakeError's first failure
};

// The scalar oracle: plain loops, f32 (f64 where it is cheap) and no tricks. Slow.
std::unique_ptr<Backend> CreateReferenceBackend();

struct CpuBackendOptions {
  // Threads for the kernels; <= 0: one per CPU this process can keep busy (its affinity
  // mask, capped by its cgroup CPU quota, e.g. Kubernetes limits.cpu; core/cpu_quota.h).
  int num_threads = 0;
  // "auto" picks AMX (AVX-512 + AMX-BF16 for bf16 Linear) when the CPU and OS
  // allow it, else AVX-512 when the CPU has it, else AVX2; "avx2" forces the
  // fallback; "avx512" insists on AVX-512 (F/BW/VL/DQ) without AMX; "amx" insists on AMX;
  // "avx512bf16" is AVX-512 whose bf16-compute-mode Linear uses VDPBF16PS ("auto" takes
  // it in that mode on AMD CPUs without AMX).
  // The environment variable KVMESH_CPU_ISA, when set, replaces "auto".
  std::string_view isa = "auto";
  // What Linear computes in. kF32 (the default): exact f32 activations times the
  // weights widened to f32. kBF16 (opt-in, `--compute-dtype bf16`): weights packed as
  // bf16 (f32/f16 ones rounded to nearest even at PackLinear) and each activation
  // rounded to bf16 before the product, summed in f32: the numerics vLLM and llama.cpp
  // use for bf16 models, and ~3x the AMX throughput. Other ops stay f32 either way.
  DType compute_dtype = DType::kF32;
};
// FailedPrecondition if the CPU lacks AVX2+FMA+F16C (or the ISA asked for);
// InvalidArgument for an unknown `isa` or a compute_dtype other than f32 / bf16. The
// backend's name() is "cpu-amx", "cpu-avx512", "cpu-avx512bf16" or "cpu-avx2", with "-bf16" in the
// bf16 compute mode. On AMX, bf16-weight Linear in f32 mode splits each f32
// activation into three bf16 terms (its error is that of an f32 FMA chain, see
// cpu/amx_linear_kernel.cc). Linear is batch invariant in both modes: a row's result
// is bitwise the same for every M, position in the batch and thread count.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options);

// The CUDA backend (backend/cuda/cuda_backend.h) on GPU `device`: its ops take device
// memory, so only the CUDA model runner (engine/cuda_model_runner.h) can drive it.
// FailedPrecondition where no GPU can be used, or in a build without CUDA (link
// kvmesh_backend_cuda, which is then backend/no_cuda_backend.cc).
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device);

}  // namespace kvmesh::backend
