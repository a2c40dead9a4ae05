// TensorParallelRunner: a ModelRunner that runs one model split over N rank threads
// (docs/architecture.md §4, "Tensor parallelism"). Rank 0 is the driver: the engine calls
// Execute on its thread, which runs rank 0's shard there; ranks 1..N-1 each own a
// thread that follows the driver's step plan (a copy of the batch: the same tokens,
// positions and block ids on every rank). The block tables and prefix cache stay with
// the driver's engine; every rank's KV pool has the same block ids and holds only its
// own KV heads (LlamaModel::shard()).
//
// Ranks run on the CPU or on GPUs, the same way: each has its own backend, its own
// LlamaModel shard, a communicator and a runner that runs the one forward pass
// (engine/forward_pass.h) through it. The ranks rendezvous through a TcpStoreServer on
// 127.0.0.1 served by the driver, then agree on one pool size (the smallest any rank
// can hold), so that every rank's pool has the same block ids.
//  - CPU ranks (cuda_device < 0): a CPU backend with max(1, total_threads / N) kernel
//    threads (OpenMP keeps one pool per thread that opens parallel regions, so N ranks
//    at full width would oversubscribe the cores), weights sliced from the shared mmap
//    and packed per rank, Gloo, and a PagedModelRunner.
//  - GPU ranks (cuda_device >= 0): rank r on GPU cuda_device + r with its own CUDA
//    backend, an NCCL communicator that queues its collectives on that backend's stream
//    (so they are ordered with the ops and captured into the decode graphs), and a
//    CudaModelRunner. Rank 0 may reuse a shard already loaded (rank0_model).
//
// Failure: if any rank fails a step (an error status, an exception, a lost or stuck
// peer surfacing as a communicator error within comm_timeout), the group is broken:
// that Execute returns Unavailable naming each failing rank and its error,
// on_group_failure is called once, and every later Execute returns FailedPrecondition
// at once — no step waits on a dead group. A batch every rank rejects before
// communicating (InvalidArgument) leaves the group healthy.
//
// Thread-safety: not thread-safe; Execute is called by one thread at a time (the engine
// loop). The destructor stops and joins the rank threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/cuda_model_runner.h"
#include "engine/llama_model.h"
#include "engine/model_runner.h"
#include "kv/kv_layout.h"

namespace kvmesh::comm {
class TcpStoreServer;
}  // namespace kvmesh::comm

namespace kvmesh::engine {

struct TensorParallelRunnerOptions {
  int32_t tensor_parallel_size = 2;
  int32_t block_size_tokens = kv::kDefaultBlockSizeTokens;
  // Size every rank's pool to the same block count by exactly one of: the whole group's
  // KV budget (all ranks together: each rank's pool gets 1/N of it, so without
  // replication the block count equals one rank's at the same budget), a block count,
  // or (GPU ranks) a fraction of each GPU's free memory once its shard is loaded, the
  // group taking the smallest rank's count.
  int64_t kv_cache_bytes = 0;
  int32_t num_blocks = 0;
  double kv_cache_memory_fraction = 0;
  DType kv_cache_dtype = DType::kF32;  // PagedModelRunnerOptions / CudaModelRunnerOptions
  // -1: CPU ranks. Else GPU ranks, rank r on CUDA device cuda_device + r.
  int cuda_device = -1;
  // GPU ranks: each rank's runner options (step sizes, graphs, host mirror); its block
  // size, dtype and pool sizing are replaced by the fields above.
  CudaModelRunnerOptions cuda;
  // GPU ranks: rank 0's shard, already loaded on GPU cuda_device (rank 0 of
  // tensor_parallel_size), to run on instead of loading another copy there; nullptr to
  // load it. Must outlive the runner.
  LlamaModel* rank0_model = nullptr;
  // CPU ranks: kernel threads of all ranks together; <= 0: UsableCpus() (core/cpu_quota.h).
  int total_threads = 0;
  std::string isa = "auto";  // CpuBackendOptions::isa
  DType compute_dtype = DType::kF32;  // CpuBackendOptions::compute_dtype
  // Bound on the rendezvous and on each collective: how long a lost peer can stall a step.
  absl::Duration comm_timeout = absl::Seconds(30);
  // Progress of rank 0's load (the others load the same way in parallel).
  std::function<void(const LoadProgress&)> on_progress;
  // Called once, on the driver's thread, when the group breaks (see above).
  std::function<void(const absl::Status&)> on_group_failure;
  // Test hook: runs on each rank's thread before it executes a step; may throw or block
  // to simulate a failing rank.
  std::function<void(int32_t rank, int64_t step)> before_rank_step;
};

class TensorParallelRunner : public ModelRunner {
 public:
  // Loads every rank's shard in parallel and connects the group. InvalidArgument (before
  // any thread starts) when the model cannot be split over tensor_parallel_size (heads,
  // KV heads, intermediate size or vocabulary not divisible) or the pool sizes are
  // invalid; FailedPrecondition (also before) for GPU ranks without that many GPUs from
  // cuda_device on, or a build without CUDA and NCCL; a rank's load or rendezvous error
  // otherwise, naming the rank.
  static absl::StatusOr<std::unique_ptr<TensorParallelRunner>> Create(const std::string& model_dir,
                                                                      const TensorParallelRunnerOptions& options);
  ~TensorParallelRunner() override;
  TensorParallelRunner(const TensorParallelRunner&) = delete;
  TensorParallelRunner& operator=(const TensorParallelRunner&) = delete;

  int32_t vocab_size() const override;
  int32_t block_size_tokens() const override;
  int32_t num_blocks() const override;
  absl::StatusOr<ModelOutput> Execute(const ModelBatch& batch) override;
  // As rank 0's runner (every rank runs the same chunks).
  bool all_position_logits() const override;
  bool returns_argmax() const override;
  // Each rank keeps its own copy (every rank executes every batch; once the group breaks
  // no batch runs anywhere).
  bool keeps_block_tables() const override { return true; }
  // NOTE: nullptr: KV is spread over the ranks' pools (a block's KV is every rank's
  // share of it); the transfer paths take each rank's pool (GPU ranks: its host mirror)
  // from kv_rank_storages(), empty unless every rank has one.
  kv::KvStorage* kv_storage() override { return nullptr; }
  std::vector<kv::KvStorage*> kv_rank_storages() override;
  std::optional<kv::KvLayout> kv_pool_layout() override { return rank_layout(0); }
  // Every rank's runner copies its own blocks, the ranks side by side.
  absl::Status CopyKvToHostMirror(std::span<const int32_t> blocks) override;
  absl::Status CopyKvFromHostMirror(std::span<const int32_t> blocks) override;
  // Every rank copies its own heads into its share of the slot (ModelBatch swaps): its
  // runner's figures already count every rank.
  int64_t kv_swap_bytes_per_block() const override;
  KvSlotShape kv_slot_shape() const override;

  int32_t tensor_parallel_size() const { return static_cast<int32_t>(ranks_.size()); }
  // Rank `rank`'s KV pool layout (its accounting: TotalBytes(), kv_head_replication()).
  const kv::KvLayout& rank_layout(int32_t rank) const;
  const LlamaModel& rank_model(int32_t rank) const;
  // Wall seconds rank `rank` has spent inside collectives (waiting for peers included),
  // for the communication share of step time; GPU ranks only queue theirs, so this is
  // their queueing time. Not to be called during Execute of a broken group (the rank's
  // communicator is gone; then 0).
  double communication_seconds(int32_t rank) const;
  // OK until the group breaks; then the error every Execute reports.
  absl::Status health() const;
  // One line for the start-up log: ranks, heads and KV heads per rank, replication.
  std::string DescribeSharding() const;

 private:
  struct Rank;
  explicit TensorParallelRunner(const TensorParallelRunnerOptions& options);
  // Builds rank `r` (backend, shard, communicator, runner) on the calling thread: the
  // shard and communicator, then the pool size the ranks agree on, then the runner.
  // `num_blocks`: the group's pool size when known up front, else 0 (a memory fraction).
  absl::Status SetUpRank(int32_t r, const std::string& model_dir, const std::string& store_address,
                         int32_t num_blocks);
  absl::Status SetUpRankShard(int32_t r, const std::string& model_dir, const std::string& store_address);
  absl::Status SetUpRankRunner(int32_t r, int32_t num_blocks);
  // GPU ranks' runner options: options_.cuda with the group's block size and dtype, and
  // the pool sized by `num_blocks`, or (0) by the group's memory fraction.
  CudaModelRunnerOptions RankCudaOptions(int32_t num_blocks) const;
  // Posts rank r's pool size (or its set-up error), waits for every rank's and returns
  // the smallest; FailedPrecondition when another rank failed to set up.
  absl::StatusOr<int32_t> AgreeOnPoolBlocks(int32_t r, absl::StatusOr<int32_t> blocks);
  // Runs fn(r) for every rank side by side (rank 0 on the calling thread) between steps.
  absl::Status ForEachRank(const std::string& what, const std::function<absl::Status(int32_t)>& fn);
  // Runs rank `r`'s share of one step; exceptions become Internal. On failure closes the
  // rank's communicator so that peers fail fast instead of waiting out the timeout.
  absl::StatusOr<ModelOutput> RunRank(int32_t r, const ModelBatch& batch, int64_t step);
  void FollowerLoop(int32_t r);
  // Driver, during a step whose batch has on_layer_kv_written: until every follower has
  // written `layer` (or ended the step, or comm_timeout passed).
  void WaitForLayerOnEveryRank(int32_t layer, int64_t step);
  void StopFollowers();

  const TensorParallelRunnerOptions options_;
  std::unique_ptr<comm::TcpStoreServer> store_server_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  absl::Status group_status_;  // driver thread only

  // Driver <-> followers. The plan is written only while no follower runs a step.
  std::mutex mu_;
  std::condition_variable cv_;
  ModelBatch plan_;          // guarded by mu_ (copy of the batch, without callbacks)
  int64_t step_ = 0;         // guarded by mu_: the step the plan belongs to
  bool stopping_ = false;    // guarded by mu_
  bool plan_streams_layers_ = false;  // guarded by mu_: the step's batch has on_layer_kv_written
};

}  // namespace kvmesh::engine
