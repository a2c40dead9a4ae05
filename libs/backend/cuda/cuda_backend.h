// The CUDA backend: every Backend op (libs/backend/ops.h) on one GPU, through kernels/
// and cuBLAS, on one stream.
//
// Memory: every TensorView and span an op takes is DEVICE memory, except PackLinear's
// parts and biases, which are the model's host weights (they are uploaded there). The
// PagedAttentionBatch spans are device memory too, so the batch must carry its host-known
// max_query_len and max_context_len. A runner that owns device activations and a device
// KV pool drives it (engine/cuda/cuda_model_runner.cc); the host-side runners
// (PagedModelRunner, LlamaModel::Forward) cannot.
//
// GEMMs: bf16 and f16 weights stay 16-bit on the device; the f32 activation is rounded to
// the weight's type (as vLLM runs a bf16 model: bf16 operands) and cuBLAS multiplies on
// tensor cores with f32 accumulation and an f32 output. f32 weights use an f32 GEMM with
// TF32 off, so an f32 model matches the CPU backends to f32 rounding.
//
// Errors: ops.h's contract, clause 2: the first failed launch or CUDA error is kept and
// later ops are skipped; TakeError() returns it (and the runner fails its step).
//
// Thread-safety: not thread-safe; one engine thread drives it. All work is ordered on
// stream(); the caller synchronizes before reading results on the host.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/ops.h"
#include "core/cuda_memory.h"

namespace kvmesh::backend::cuda {

using ::kvmesh::cuda::AllocateDevice;
using ::kvmesh::cuda::AllocatePinnedHost;
using ::kvmesh::cuda::CudaStatus;
using ::kvmesh::cuda::DeviceMemory;
using ::kvmesh::cuda::PinnedHostMemory;

struct CudaBackendOptions {
  int device = 0;
};

class CudaBackend : public Backend {
 public:
  // FailedPrecondition when no CUDA device can be used (no GPU or no driver: the message
  // says which), or `device` is not one of them.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string_view name() const override { return name_; }
  bool uses_host_memory() const override { return false; }
  absl::StatusOr<std::unique_ptr<PackedLinear>> PackLinear(std::span<const TensorView> parts,
                                                           std::span<const TensorView> biases) override;
  void Linear(const TensorView& x, const PackedLinear& w, const TensorView& out) override;
  void Embedding(std::span<const int32_t> ids, const TensorView& table, const TensorView& out) override;
  void EmbeddingShard(std::span<const int32_t> ids, const TensorView& table, int64_t first_id,
                      const TensorView& out) override;
  void RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) override;
  void AddRmsNorm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                  const TensorView& out) override;
  void ApplyRope(const TensorView& q, const TensorView& k, std::span<const int32_t> positions,
                 std::span<const float> inv_freq) override;
  void SiluAndMul(const TensorView& gate_up, const TensorView& out) override;
  void DenseAttention(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                      std::span<const int32_t> positions, float scale, const TensorView& out) override;
  // Slots may be negative (padding rows, skipped). kv_cache: f32, bf16 or fp8 e4m3 (scales
  // from SetFp8KvScales, 1.0 until then).
  void WriteKvCache(const TensorView& k, const TensorView& v, std::span<const int64_t> slots,
                    const TensorView& kv_cache) override;
  // Decode batches (max_query_len == 1) run the split-K decode kernel; any other batch the
  // tiled prefill kernel (tensor cores, bf16 operands: see its header for tolerances).
  void PagedAttention(const TensorView& q, const TensorView& kv_cache, const PagedAttentionBatch& batch,
                      float scale, const TensorView& out) override;
  // One cudaMemcpy2DAsync on stream().
  void CopyColumns(const TensorView& src, int64_t src_col, const TensorView& dst, int64_t dst_col,
                   int64_t width) override;
  void GatherAddRows(const TensorView& a, const TensorView& b, std::span<const int32_t> rows,
                     const TensorView& out) override;
  void ArgmaxRows(const TensorView& x, std::span<int32_t> out) override;
  // One LaunchCopyBlocks for every pair and layer (pairs: device memory).
  void CopyBlocks(const BlockPool& pool, std::span<const int32_t> pairs) override;
  // The pairs are checked on the host first (a failed check is recorded and nothing is
  // copied). Then one LaunchSwapBlocks for every pair and layer when the GPU can address
  // both pools and `pairs` in place (device, managed or pinned host memory mapped into the
  // device's address space); else LaunchSwapBlocksMemcpy, one cudaMemcpyAsync per (pair,
  // layer), for a pageable host side. Either way `pairs` and the host pool must stay
  // unchanged until the stream has run the copy.
  void SwapBlocks(const BlockPool& src, const BlockPool& dst, std::span<const int32_t> pairs) override;
  void ScatterPairs(std::span<const int32_t> updates, std::span<int32_t> array) override;
  void GatherTableRows(std::span<const int32_t> rows, int64_t row_stride, std::span<const int32_t> rows_of,
                       std::span<const int32_t> context_lens, int32_t block_size_tokens,
                       std::span<int32_t> out) override;
  // Device memory (cudaMalloc, freed when the Buffer goes), 256-byte aligned. ResourceExhausted
  // naming `what` when the device is out of memory, Internal for any other CUDA failure;
  // neither is kept as this backend's error. Synchronous like cudaMalloc: no stream order.
  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(int64_t bytes, std::string_view what) override;

  // stream(), as ops.h's queue().
  void* queue() const override { return stream_; }
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  // The first error since the last call (OK if none), and clears it.
  absl::Status TakeError() override;
  // Records a failure of the caller's own work on stream(): kept if no error is yet (the
  // ops after it are skipped), returned by the next TakeError(). An OK `status` is ignored.
  void RecordError(absl::Status status) override;
  // The same for a CUDA error (cudaSuccess is ignored), as CudaStatus(err, what).
  void RecordError(cudaError_t err, absl::string_view what);
  // Grows device scratch the ops share (decode attention's split-K partials, activation
  // casts) to serve max_tokens rows of width max_width and max_seqs decode rows up to
  // max_context_len, so that no op allocates inside a CUDA graph capture. ResourceExhausted
  // (and no error kept) when the device lacks the memory.
  absl::Status ReserveWorkspace(const WorkspaceLimits& limits) override;
  // FP8 KV: per-KV-head scales (stored = value / scale), the same for K and V of every
  // layer unless given per layer later. Device copies; 1.0 by default.
  absl::Status SetFp8KvScales(std::span<const float> k_scale, std::span<const float> v_scale);

 private:
  CudaBackend() = default;
  bool Failed() const { return !error_.ok(); }
  // Ensures scratch_ holds `bytes`; false (error recorded) if it cannot.
  bool EnsureScratch(size_t bytes, DeviceMemory& scratch, absl::string_view what);

  int device_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceMemory cublas_workspace_;
  DeviceMemory cast_scratch_;       // a GEMM's activation rounded to bf16/f16
  DeviceMemory attention_scratch_;  // decode attention's split-K partials
  DeviceMemory k_scale_, v_scale_;  // [kMaxKvHeads] f32 FP8 scales
  absl::Status error_;
};

}  // namespace kvmesh::backend::cuda
