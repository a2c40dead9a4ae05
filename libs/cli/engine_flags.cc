#include "cli/engine_flags.h"
#include "cli/engine_flags_kv_store.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/memory_info.h"
#include "core/status_macros.h"
#include "cli/cli_common.h"
#include "engine/cuda_model_runner.h"
#include "engine/tensor_parallel_runner.h"
#include "xxhash.h"
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
          "On --device cpu the ranks share --threads and talk over Gloo; on --device cuda:N rank r drives GPU N + r "
          "and they talk over NCCL. The KV budget is the group's total (a memory fraction is each GPU's).");
KVMESH_FLAG_RANGE(tensor_parallel_size, 1, 64);
ABSL_DECLARE_FLAG(int, threads);  // cli_common.cc
ABSL_FLAG(int, max_model_len, 0, "Context length (prompt + completion); 0: the model's max_position_embeddings.");
ABSL_FLAG(int64_t, kv_host_cache_bytes, 0,
          "Host-memory KV tier under the KV pool, in bytes (0: off). Evicted prefix blocks are offloaded here and "
          "onboarded on a later prefix hit; needs prefix caching.");
ABSL_FLAG(std::string, kv_host_memory, "auto",
          "Memory of the host KV tier: auto (huge pages on a CPU worker, pinned on --device cuda) or uvm (CUDA managed "
          "memory with advise/prefetch; --device cuda only).");
ABSL_FLAG(std::string, kv_offload_policy, "auto",
          "When a block goes down to the host tier: write-back (as tier 0 evicts it), write-through (as soon as tier 0 "
          "caches it), or auto: write-through with --kv-store (so other workers can load a prefix soon after it was "
          "computed), else write-back.");
ABSL_DECLARE_FLAG(std::string, kv_store);
ABSL_FLAG(std::string, kv_disk_cache_dir, "",
          "Directory of the disk KV tier (io_uring, survives restarts); needs --kv-host-cache-bytes. Empty: off.");
ABSL_FLAG(int64_t, kv_disk_cache_bytes, int64_t{16} << 30, "Capacity of the disk KV tier in bytes.");
KVMESH_FLAG_RANGE(kv_host_cache_bytes, 0, int64_t{1} << 50);
KVMESH_FLAG_RANGE(kv_disk_cache_bytes, 1, int64_t{1} << 56);
KVMESH_FLAG_RANGE(max_model_len, 0, 1 << 24);
ABSL_FLAG(bool, enforce_eager, false, "--device cuda: run decode steps eagerly instead of replaying CUDA graphs.");

namespace kvmesh::cli {
namespace {

// What the disk KV tier's records are salted with, so that a directory shared by two
// models never serves one's KV to the other: XXH3 over config.json and the names and
// sizes of the weight files (a content fingerprint that every worker of the same
// model computes alike, wherever its files live).
uint64_t ModelIdentity(const engine::LlamaModel& model) {
  namespace fs = std::filesystem;
  std::string fingerprint;
  const fs::path root(model.model_dir());
  std::error_code ec;
  if (fs::is_regular_file(root, ec)) {
    absl::StrAppend(&fingerprint, root.filename().string(), ":", fs::file_size(root, ec));
  } else {
    std::ifstream config(root / "config.json", std::ios::binary);
    fingerprint.assign(std::istreambuf_iterator<char>(config), std::istreambuf_iterator<char>());
    std::vector<std::string> weights;
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.ends_with(".safetensors") || name.ends_with(".gguf") || name.ends_with(".bin")) {
        weights.push_back(absl::StrCat(name, ":", entry.file_size(ec)));
      }
    }
    std::sort(weights.begin(), weights.end());
    for (const std::string& w : weights) absl::StrAppend(&fingerprint, "|", w);
  }
  return XXH3_64bits(fingerprint.data(), fingerprint.size());
}

}  // namespace

absl::StatusOr<EngineFromFlags> BuildEngineFromFlags(engine::LlamaModel& model, const EngineFromFlagsOptions& build) {
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
  auto on_group_failure = [](const absl::Status& status) {
    KVMESH_LOG(kError) << "stopping: a tensor-parallel rank failed and the group cannot continue"
                       << LogKv("error", status.message());
    // Process-directed (not raise()): the commands take SIGTERM with sigwait on their
    // main thread, and every other thread blocks it.
    kill(getpid(), SIGTERM);
  };
  if (cuda_device >= 0) {
    engine::CudaModelRunnerOptions cuda{
        .block_size_tokens = absl::GetFlag(FLAGS_block_size),
        .kv_cache_dtype = kv_dtype,
        .max_num_tokens = std::max(absl::GetFlag(FLAGS_max_num_batched_tokens), absl::GetFlag(FLAGS_max_num_seqs)),
        .max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs),
        .max_model_len = max_model_len,
        .enable_cuda_graphs = !absl::GetFlag(FLAGS_enforce_eager),
        .host_kv_mirror = build.moves_kv,
    };
    // A memory fraction is of the GPU's free memory (vLLM's gpu_memory_utilization, of
    // what the weights left), not of the host's.
    const double fraction = absl::GetFlag(FLAGS_kv_cache_memory_fraction);
    if (tp == 1) {
      if (fraction != 0) {
        cuda.kv_cache_memory_fraction = fraction;
      } else {
        cuda.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
      }
      KVMESH_ASSIGN_OR_RETURN(out.runner, engine::CreateCudaModelRunner(model, cuda));
    } else {
      // One rank per GPU from cuda_device on; rank 0 runs on the shard already loaded
      // there (LoadModelFromFlags loads rank 0's slice under --tensor-parallel-size).
      engine::TensorParallelRunnerOptions tp_options{
          .tensor_parallel_size = tp,
          .block_size_tokens = absl::GetFlag(FLAGS_block_size),
          .kv_cache_bytes = fraction != 0 ? 0 : absl::GetFlag(FLAGS_kv_cache_bytes),
          .kv_cache_memory_fraction = fraction,
          .kv_cache_dtype = kv_dtype,
          .cuda_device = cuda_device,
          .cuda = cuda,
          .rank0_model = &model,
      };
      tp_options.on_group_failure = on_group_failure;
      KVMESH_ASSIGN_OR_RETURN(out.runner, engine::TensorParallelRunner::Create(model.model_dir(), tp_options));
    }
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
    KVMESH_ASSIGN_OR_RETURN(tp_options.compute_dtype, ComputeDTypeFromFlags());
    tp_options.on_group_failure = on_group_failure;
    KVMESH_ASSIGN_OR_RETURN(out.runner, engine::TensorParallelRunner::Create(model.model_dir(), tp_options));
  }
  out.options.scheduler.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  out.options.scheduler.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  out.options.kv.block_size_tokens = absl::GetFlag(FLAGS_block_size);
  out.options.kv.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  out.options.kv.record_events = false;  // nothing consumes KV events in one process
  out.options.max_model_len = max_model_len;
  KVMESH_ASSIGN_OR_RETURN(out.options.tiers, KvTierOptionsFromFlags(model, cuda_device));
  KVMESH_RETURN_IF_ERROR(AddKvStoreFromFlags(model, tp, absl::GetFlag(FLAGS_block_size),
                                             out.options.kv.enable_prefix_caching, &out.options.tiers));
  return out;
}

absl::StatusOr<engine::EngineKvTierOptions> KvTierOptionsFromFlags(const engine::LlamaModel& model, int cuda_device) {
  const bool on_cuda = cuda_device >= 0;
  engine::EngineKvTierOptions tiers;
  tiers.host_cache_bytes = absl::GetFlag(FLAGS_kv_host_cache_bytes);
  if (tiers.host_cache_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-host-cache-bytes must be >= 0, got ", tiers.host_cache_bytes));
  }
  const std::string memory = absl::GetFlag(FLAGS_kv_host_memory);
  if (memory != "auto" && memory != "uvm") {
    return absl::InvalidArgumentError(absl::StrCat("--kv-host-memory must be auto or uvm, got '", memory, "'"));
  }
  if (memory == "uvm" && !on_cuda) {
    return absl::InvalidArgumentError(
        "--kv-host-memory=uvm needs --device cuda: managed memory is a CUDA feature; a CPU worker's host tier is "
        "plain huge-page memory");
  }
  if (on_cuda && tiers.host_cache_bytes > 0) {
    // The runner's swap kernel reads and writes the slots in place: pinned or managed.
    KVMESH_ASSIGN_OR_RETURN(engine::CudaHostTierMemory memory,
                            engine::MakeCudaHostTierMemory(cuda_device, /*managed=*/memory == "uvm"));
    tiers.host_allocate = std::move(memory.allocate);
    tiers.host_deallocate = std::move(memory.deallocate);
  }
  const std::string policy = absl::GetFlag(FLAGS_kv_offload_policy);
  if (policy != "auto" && policy != "write-back" && policy != "write-through") {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-offload-policy must be auto, write-back or write-through, got '", policy, "'"));
  }
  tiers.write_through = policy == "write-through" || (policy == "auto" && !absl::GetFlag(FLAGS_kv_store).empty());
  tiers.disk_cache_dir = absl::GetFlag(FLAGS_kv_disk_cache_dir);
  tiers.disk_cache_bytes = absl::GetFlag(FLAGS_kv_disk_cache_bytes);
  if (!tiers.disk_cache_dir.empty() && tiers.disk_cache_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-disk-cache-bytes must be positive, got ", tiers.disk_cache_bytes));
  }
  tiers.model_identity = ModelIdentity(model);
  return tiers;
}

}  // namespace kvmesh::cli
