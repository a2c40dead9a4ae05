// The engine flags `serve`, `worker` and `bench throughput` share (KV pool, block size,
// scheduler budget, tensor parallelism) and building the runner and Engine options
// from them.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "engine/paged_model_runner.h"

namespace kvmesh::cli {

// The file name fragment whose flags --help lists for commands that use these.
inline constexpr char kEngineFlagsFile[] = "engine_flags";

struct EngineFromFlags {
  // A PagedModelRunner over `model`; with --tensor-parallel-size N > 1 a
  // TensorParallelRunner whose N rank threads load their own shards of model.model_dir().
  std::unique_ptr<engine::ModelRunner> runner;
  engine::EngineOptions options;  // max_model_len: --max-model-len, else the model's context
};

// Sizes the KV pool from --kv-cache-bytes or --kv-cache-memory-fraction and fills the
// scheduler/KV options and max_model_len. InvalidArgument for out-of-range flags
// (e.g. --max-model-len beyond the model's max_position_embeddings), or a model that
// cannot be split over --tensor-parallel-size (the message says which dimension).
// Under tensor parallelism a failed rank stops the process: the error is logged and
// SIGTERM raised, so the command's usual shutdown runs (requests in flight end with
// the error) instead of the worker hanging or serving from a broken group.
struct EngineFromFlagsOptions {
  // The engine moves KV to or from other workers (a worker with --role prefill or
  // decode): a runner whose pool is in device memory keeps a host mirror of it
  // (CudaModelRunnerOptions::host_kv_mirror).
  bool moves_kv = false;
};
absl::StatusOr<EngineFromFlags> BuildEngineFromFlags(engine::LlamaModel& model,
                                                     const EngineFromFlagsOptions& build = {});

// --kv-host-cache-bytes, --kv-host-memory, --kv-disk-cache-dir, --kv-disk-cache-bytes.
// InvalidArgument naming the flag for a negative size or uvm without --device cuda. On
// `cuda_device` >= 0 the host tier's memory is pinned (or managed, with uvm) so the CUDA
// runner's swap kernel reads and writes it in place; -1 is a CPU worker.
absl::StatusOr<engine::EngineKvTierOptions> KvTierOptionsFromFlags(const engine::LlamaModel& model, int cuda_device);

// --kv-cache-dtype: f32, bf16, or auto (bf16 for a model whose weights are bf16, as
// vLLM's "auto" follows the model's dtype; else f32). InvalidArgument otherwise.
absl::StatusOr<DType> KvCacheDTypeFromFlags(const engine::LlamaModel& model);

}  // namespace kvmesh::cli
