// The model runner for `--device cuda`: the whole step (embedding, every layer, the final
// norm and LM head) on one GPU through the CUDA backend, over a KV pool in device memory,
// with CUDA graphs for decode steps. The engine, scheduler and sampler are unchanged: the
// runner returns the logits rows to the host like PagedModelRunner does.
//
// This header names no CUDA type, so the services include it in every build; a build
// without nvcc links engine/no_cuda.cc, whose factory says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "engine/llama_model.h"
#include "engine/model_runner.h"
#include "kv/kv_types.h"

namespace kvmesh::comm {
class Communicator;
}  // namespace kvmesh::comm

namespace kvmesh::engine {

struct CudaModelRunnerOptions {
  int32_t block_size_tokens = kv::kDefaultBlockSizeTokens;
  // Size the device KV pool by exactly one of these: bytes, a fraction of the device
  // memory free once the weights are loaded (vLLM's gpu_memory_utilization, applied to
  // what is left), or a block count.
  int64_t kv_cache_bytes = 0;
  double kv_cache_memory_fraction = 0;
  int32_t num_blocks = 0;
  DType kv_cache_dtype = DType::kBF16;  // f32, bf16 or fp8 (e4m3, per-head scales 1.0)
  // The largest step: tokens (the scheduler's max_num_batched_tokens) and sequences
  // (max_num_seqs). Activations and metadata are allocated once for these, so that
  // captured graphs keep valid pointers.
  int32_t max_num_tokens = 2048;
  int32_t max_num_seqs = 64;
  // Context length; decode graphs are captured for it.
  int32_t max_model_len = 0;
  // Capture decode steps (every chunk one token) as CUDA graphs, per batch-size bucket.
  bool enable_cuda_graphs = true;
  // Keep a host mirror of the pool for prefill -> decode KV transfer (a worker with
  // --role prefill or decode): kv_rank_storages() is then host memory of the pool's
  // layout and block ids, registered with CUDA (cudaHostRegister: DMA in both directions)
  // and with the transport, and blocks are copied between it and the device pool as the
  // transfer paths ask (ModelRunner::CopyKvToHostMirror; layer by layer during a streamed
  // prefill's step). Why a whole mirror and not a bounded staging ring: the transports
  // address the receiver's blocks by pool block id (lease descriptors), so a mirror with
  // the same ids needs no second mapping; vLLM's host-buffer NIXL path does the same. It
  // costs host memory equal to the device pool.
  bool host_kv_mirror = false;
};

// `model` must have been loaded on the CUDA backend (cli: --device cuda) and outlive the
// runner. Under tensor parallelism `model` is this rank's shard (LlamaModelOptions) and
// `comm` (outliving the runner) is the rank's NCCL communicator, made to queue its
// collectives on the model's backend stream (NcclCommunicatorOptions::queue =
// Backend::queue()); a TensorParallelRunner drives one such runner per GPU.
// FailedPrecondition in a build without CUDA, for a model on another backend, or a
// communicator that does not queue on that stream; InvalidArgument for bad sizes, a
// shard that does not match `comm` or a head_dim the attention kernels are not built for
// (64 and 128 are); ResourceExhausted when the device cannot hold the pool, or the host
// its mirror (host_kv_mirror).
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaModelRunner(LlamaModel& model,
                                                                   const CudaModelRunnerOptions& options,
                                                                   comm::Communicator* comm = nullptr);

// How many blocks CreateCudaModelRunner(model, options) would give its pool, measured
// now on the model's GPU (a memory fraction is of its free memory). A tensor-parallel
// group sizes every rank's pool to the smallest of its ranks' counts. Errors as
// CreateCudaModelRunner's for the sizes.
absl::StatusOr<int32_t> CudaKvPoolBlocks(const LlamaModel& model, const CudaModelRunnerOptions& options);

// Memory for a CUDA worker's host KV tier (EngineKvTierOptions::host_allocate): pinned
// with cudaHostAlloc (portable, so any context's kernels read it in place), or with
// `managed` (--kv-host-memory=uvm) cudaMallocManaged, advised to live in host memory and
// to be accessed by `device` in place, and prefetched there once so the pages exist.
// FailedPrecondition in a build without CUDA; the allocator returns nullptr on failure.
struct CudaHostTierMemory {
  std::function<std::byte*(int64_t bytes)> allocate;
  std::function<void(std::byte*)> deallocate;
};
absl::StatusOr<CudaHostTierMemory> MakeCudaHostTierMemory(int device, bool managed);

}  // namespace kvmesh::engine
