#include "engine_flags.h"

#include <signal.h>
#include <unistd.h>

#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/memory_info.h"
#include "core/status_macros.h"
#include "cli_common.h"
#include "engine/cuda_model_runner.h"
#include "engine/tensor_parallel_runner.h"
#include "core/flag_checks.h"

ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{1} << 30, "KV cache pool size in bytes (unless --kv-cache-memory-fraction).");
KVMESH_FLAG_RANGE(kv_cache_bytes, 0, int64_t{1} << 50);
ABSL_FLAG(double, kv_cache_memory_fraction, 0.0,
          "Size the KV pool as this fraction of the host's available memory (0: use --kv-cache-bytes).");
KVMESH_FLAG_RANGE(kv_cache_memory_fraction, 0, 1);
ABSL_FLAG(int, block_size, 16, "KV block size in tokens.");
KVMESH_FLAG_RANGE(block_size, 1, 1024);
ABSL_FLAG(bool, enable_prefix_caching, true, "Reuse the KV blocks of shared prompt prefixes.");
ABSL_FLAG(int, max_num_seqs, 64, "Scheduler: sequences per engine step.");
KVMESH_FLAG_RANGE(max_num_seqs, 1, 65536);
ABSL_FLAG(int, max_num_batched_tokens, 2048, "Scheduler: tokens per engine step (chunked-prefill budget).");
KVMESH_FLAG_RANGE(max_num_batched_tokens, 1, 1 << 24);
ABSL_FLAG(int, tensor_parallel_size, 1,
          "Split the model over this many rank threads (tensor parallelism; heads, MLP and vocabulary must divide). "
          "The KV budget is the group's total; --threads is shared among the ranks.");
KVMESH_FLAG_RANGE(tensor_parallel_size, 1, 64);
ABSL_DECLARE_FLAG(int, threads);  // cli_common.cc
ABSL_FLAG(int, max_model_len, 0, "Context length (prompt + completion); 0: the model's max_position_embeddings.");
KVMESH_FLAG_RANGE(max_model_len, 0, 1 << 24);
ABSL_FLAG(bool, enforce_eager, false, "--device cuda: run decode steps eagerly instead of replaying CUDA graphs.");

namespace kvmesh::cli {

absl::StatusOr<EngineFromFlags> BuildEngineFromFlags(engine::LlamaModel& model) {
  int64_t kv_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  if (const double fraction = absl::GetFlag(FLAGS_kv_cache_memory_fraction); fraction != 0) {
    if (!(fraction > 0 && fraction < 1)) return absl::InvalidArgumentError("--kv-cache-memory-fraction must be in (0, 1)");
    KVMESH_ASSIGN_OR_RETURN(const int64_t available, AvailableHostMemoryBytes());
    kv_bytes = static_cast<int64_t>(fraction * static_cast<double>(available));
  }
  EngineFromFlags out;
  KVMESH_ASSIGN_OR_RETURN(const DType kv_dtype, KvCacheDTypeFromFlags(model));
  const int tp = absl::GetFlag(FLAGS_tensor_parallel_size);
  if (tp < 1) return absl::InvalidArgumentError("--tensor-parallel-size must be >= 1");
  KVMESH_ASSIGN_OR_RETURN(const int cuda_device, CudaDeviceFromFlags());
  const int64_t context = model.config().max_position_embeddings;
  const int32_t max_model_len_flag = absl::GetFlag(FLAGS_max_model_len);
  if (max_model_len_flag > context)
    return absl::InvalidArgumentError("--max-model-len exceeds the model's max_position_embeddings");
  const int32_t max_model_len = max_model_len_flag > 0 ? max_model_len_flag : static_cast<int32_t>(context);
  if (cuda_device >= 0) {
    if (tp != 1) return absl::InvalidArgumentError("--tensor-parallel-size > 1 is not available with --device cuda yet");
    engine::CudaModelRunnerOptions cuda{
        .block_size_tokens = absl::GetFlag(FLAGS_block_size),
        .kv_cache_dtype = kv_dtype,
        .max_num_tokens = std::max(absl::GetFlag(FLAGS_max_num_batched_tokens), absl::GetFlag(FLAGS_max_num_seqs)),
        .max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs),
        .max_model_len = max_model_len,
        .enable_cuda_graphs = !absl::GetFlag(FLAGS_enforce_eager),
    };
    // A memory fraction is of the GPU's free memory (vLLM's gpu_memory_utilization, of
    // what the weights left), not of the host's.
    if (const double fraction = absl::GetFlag(FLAGS_kv_cache_memory_fraction); fraction != 0) {
      cuda.kv_cache_memory_fraction = fraction;
    } else {
      cuda.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
    }
    KVMESH_ASSIGN_OR_RETURN(out.runner, engine::CreateCudaModelRunner(model, cuda));
  } else if (tp == 1) {
    KVMESH_ASSIGN_OR_RETURN(out.runner, engine::PagedModelRunner::Create(
                                            model, {.block_size_tokens = absl::GetFlag(FLAGS_block_size),
                                                    .kv_cache_bytes = kv_bytes,
                                                    .kv_cache_dtype = kv_dtype}));
  } else {
    engine::TensorParallelRunnerOptions tp_options{
        .tensor_parallel_size = tp,
        .block_size_tokens = absl::GetFlag(FLAGS_block_size),
        .kv_cache_bytes = kv_bytes,
        .kv_cache_dtype = kv_dtype,
        .total_threads = absl::GetFlag(FLAGS_threads),
    };
    tp_options.on_group_failure = [](const absl::Status& status) {
      KVMESH_LOG(kError) << "stopping: a tensor-parallel rank failed and the group cannot continue"
                         << LogKv("error", status.message());
      // Process-directed (not raise()): the commands take SIGTERM with sigwait on their
      // main thread, and every other thread blocks it.
      kill(getpid(), SIGTERM);
    };
    KVMESH_ASSIGN_OR_RETURN(out.runner, engine::TensorParallelRunner::Create(model.model_dir(), tp_options));
  }
  out.options.scheduler.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  out.options.scheduler.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  out.options.kv.block_size_tokens = absl::GetFlag(FLAGS_block_size);
  out.options.kv.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  out.options.kv.record_events = false;  // nothing consumes KV events in one process
  out.options.max_model_len = max_model_len;
  return out;
}

}  // namespace kvmesh::cli
