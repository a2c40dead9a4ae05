#include "engine/tensor_parallel_runner.h"

#include <algorithm>
#include <exception>

#include "absl/strings/str_cat.h"
#include "backend/ops.h"
#include "comm/gloo_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/tcp_store_client.h"
#include "comm/tcp_store_server.h"
#include "comm/timed_communicator.h"
#include "core/cpu_quota.h"
#include "core/logging.h"
#include "core/status_macros.h"
#include "engine/paged_model_runner.h"
#include "kv/kv_layout.h"
#include "model/model_config.h"
#include "model/tensor_parallel_shard.h"

namespace kvmesh::engine {

namespace {

bool IsCommunicationError(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kFailedPrecondition;
}

// "<what>: rank 1: ...; rank 0: ...;" over the failed ranks, root causes first: a rank's
// own failure (not a communicator error it saw because a peer went away) explains the
// others. The code is the first root cause's, else the first error's.
absl::Status CombineRankErrors(const std::string& what, const std::vector<absl::Status>& statuses) {
  std::string message = what + ":";
  absl::StatusCode code = absl::StatusCode::kOk;
  for (const bool root_causes : {true, false}) {
    for (size_t r = 0; r < statuses.size(); ++r) {
      if (statuses[r].ok() || IsCommunicationError(statuses[r]) == root_causes) continue;
      if (code == absl::StatusCode::kOk) code = statuses[r].code();
      absl::StrAppend(&message, " rank ", r, ": ", statuses[r].message(), ";");
    }
  }
  return code == absl::StatusCode::kOk ? absl::OkStatus() : absl::Status(code, message);
}

}  // namespace

// One rank's resources. Followers' fields marked (mu_) are shared with the driver.
// Declared in destruction order's reverse: the runner goes first, the backend last.
struct TensorParallelRunner::Rank {
  std::unique_ptr<backend::Backend> backend;  // null when rank 0 runs on rank0_model
  std::unique_ptr<LlamaModel> owned_model;
  LlamaModel* model = nullptr;                // owned_model, or rank0_model
  std::unique_ptr<comm::TcpStoreClient> store;
  std::unique_ptr<comm::TimedCommunicator> comm;
  std::unique_ptr<ModelRunner> runner;
  std::optional<kv::KvLayout> layout;         // the runner's pool
  std::thread thread;
  bool set_up = false;          // (mu_) SetUpRank finished
  absl::Status setup_status;    // (mu_)
  bool sized = false;           // (mu_) AgreeOnPoolBlocks posted
  absl::StatusOr<int32_t> pool_blocks = 0;  // (mu_) what it posted
  int64_t done_step = 0;        // (mu_) last step this follower finished
  absl::Status step_status;     // (mu_) its result
  int32_t layers_written = 0;   // (mu_) layers of the current step whose KV it wrote (streamed steps)
};

TensorParallelRunner::TensorParallelRunner(const TensorParallelRunnerOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<TensorParallelRunner>> TensorParallelRunner::Create(
    const std::string& model_dir, const TensorParallelRunnerOptions& options) {
  const int32_t n = options.tensor_parallel_size;
  const bool on_gpus = options.cuda_device >= 0;
  // 1. Shapes that cannot be split, and devices that are not there, fail here, before
  // any thread or socket exists.
  KVMESH_ASSIGN_OR_RETURN(const model::ModelConfig config, model::LoadModelConfig(model_dir));
  KVMESH_ASSIGN_OR_RETURN(const model::TensorParallelShard shard0, model::ComputeTensorParallelShard(config, 0, n));
  int32_t num_blocks = options.num_blocks;
  const int sizings = (options.kv_cache_bytes > 0) + (num_blocks > 0) + (options.kv_cache_memory_fraction > 0);
  if (sizings != 1)
    return absl::InvalidArgumentError(
        "tensor-parallel runner: set exactly one of kv_cache_bytes, num_blocks and kv_cache_memory_fraction");
  if (options.kv_cache_memory_fraction > 0 && !on_gpus)
    return absl::InvalidArgumentError("tensor-parallel runner: kv_cache_memory_fraction sizes GPU ranks' pools only");
  if (on_gpus) {
    const int visible = comm::NumCudaDevices();
    if (options.cuda_device + n > visible)
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor parallelism over ", n, " GPUs needs CUDA devices ", options.cuda_device, "..",
          options.cuda_device + n - 1, " (one per rank); ", visible,
          " visible (a build without CUDA sees none): lower --tensor-parallel-size or check CUDA_VISIBLE_DEVICES"));
    if (options.rank0_model != nullptr &&
        (options.rank0_model->shard().size != n || options.rank0_model->shard().rank != 0))
      return absl::InvalidArgumentError(absl::StrCat("rank0_model is rank ", options.rank0_model->shard().rank,
                                                     " of ", options.rank0_model->shard().size, ", not rank 0 of ",
                                                     n));
  }
  if (options.kv_cache_bytes > 0) {
    const kv::KvLayoutOptions per_rank{.num_layers = static_cast<int32_t>(config.num_hidden_layers),
                                       .num_kv_heads = static_cast<int32_t>(shard0.num_kv_heads),
                                       .head_dim = static_cast<int32_t>(config.head_dim),
                                       .block_size_tokens = options.block_size_tokens,
                                       .dtype = options.kv_cache_dtype};
    num_blocks = kv::NumBlocksForBudget(per_rank, options.kv_cache_bytes / n);
    if (num_blocks < 1)
      return absl::InvalidArgumentError(absl::StrCat("KV budget of ", options.kv_cache_bytes, " bytes over ", n,
                                                     " ranks cannot hold one block per rank"));
  }

  std::unique_ptr<TensorParallelRunner> tp(new TensorParallelRunner(options));
  KVMESH_ASSIGN_OR_RETURN(tp->store_server_, comm::TcpStoreServer::Start({.bind_host = "127.0.0.1", .port = 0}));
  const std::string address = tp->store_server_->address();
  for (int32_t r = 0; r < n; ++r) tp->ranks_.push_back(std::make_unique<Rank>());
  // 2. Followers set up on their own threads (their OpenMP pools belong to them) while
  // rank 0 sets up on a short-lived one; the rendezvous needs all of them at once.
  // NOTE: not on the calling thread: libgomp keeps a pool per thread that opened a
  // parallel region, and rank 0 packing here would leave one beside the engine thread's
  // and the followers', more threads than cores (throttled spinning, see cli_common.cc).
  for (int32_t r = 1; r < n; ++r) {
    tp->ranks_[r]->thread = std::thread([tp = tp.get(), r, model_dir, address, num_blocks] {
      absl::Status status = tp->SetUpRank(r, model_dir, address, num_blocks);
      {
        std::lock_guard<std::mutex> lock(tp->mu_);
        tp->ranks_[r]->set_up = true;
        tp->ranks_[r]->setup_status = status;
      }
      tp->cv_.notify_all();
      if (status.ok()) tp->FollowerLoop(r);
    });
  }
  absl::Status status;
  // NOTE: rank 0 too: it must meet the others at the pool-size agreement.
  std::thread([&] { status = tp->SetUpRank(0, model_dir, address, num_blocks); }).join();
  {
    std::unique_lock<std::mutex> lock(tp->mu_);
    tp->cv_.wait(lock, [&] {
      return std::all_of(tp->ranks_.begin() + 1, tp->ranks_.end(), [](const auto& rank) { return rank->set_up; });
    });
    std::vector<absl::Status> statuses = {status};
    for (int32_t r = 1; r < n; ++r) statuses.push_back(tp->ranks_[r]->setup_status);
    status = CombineRankErrors(absl::StrCat("tensor-parallel start-up over ", n, " ranks failed"), statuses);
  }
  if (!status.ok()) return status;  // the destructor stops the followers
  // The rendezvous is over: nothing needs the store any more.
  tp->store_server_->Stop();
  if (shard0.kv_head_replication > 1) {
    KVMESH_LOG(kWarning) << "tensor parallel: more ranks than KV heads; KV heads are replicated"
                         << LogKv("num_kv_heads", config.num_key_value_heads) << LogKv("tensor_parallel_size", n)
                         << LogKv("ranks_per_kv_head", shard0.kv_head_replication);
  }
  KVMESH_LOG(kInfo) << tp->DescribeSharding();
  return tp;
}

absl::Status TensorParallelRunner::SetUpRank(int32_t r, const std::string& model_dir,
                                             const std::string& store_address, int32_t num_blocks) {
  absl::Status shard = SetUpRankShard(r, model_dir, store_address);
  absl::StatusOr<int32_t> blocks = num_blocks;
  if (!shard.ok()) {
    blocks = shard;
  } else if (num_blocks == 0) {
    // A fraction of this GPU's memory left free by its shard.
    blocks = CudaKvPoolBlocks(*ranks_[r]->model, RankCudaOptions(0));
  }
  KVMESH_ASSIGN_OR_RETURN(const int32_t agreed, AgreeOnPoolBlocks(r, std::move(blocks)));
  return SetUpRankRunner(r, agreed);
}

absl::Status TensorParallelRunner::SetUpRankShard(int32_t r, const std::string& model_dir,
                                                  const std::string& store_address) {
  Rank& rank = *ranks_[r];
  const int32_t n = options_.tensor_parallel_size;
  const bool on_gpus = options_.cuda_device >= 0;
  if (on_gpus && r == 0 && options_.rank0_model != nullptr) {
    rank.model = options_.rank0_model;
  } else {
    absl::StatusOr<std::unique_ptr<backend::Backend>> backend;
    if (on_gpus) {
      backend = backend::CreateCudaBackend(options_.cuda_device + r);
    } else {
      const int total = options_.total_threads > 0 ? options_.total_threads : UsableCpus();
      backend = backend::CreateCpuBackend(
          {.num_threads = std::max(1, total / n), .isa = options_.isa, .compute_dtype = options_.compute_dtype});
    }
    if (!backend.ok()) return backend.status();
    rank.backend = std::move(backend).value();
    LlamaModelOptions model_options{.tensor_parallel_rank = r, .tensor_parallel_size = n};
    if (r == 0) model_options.on_progress = options_.on_progress;
    auto model = LlamaModel::Load(model_dir, *rank.backend, model_options);
    if (!model.ok()) return model.status();
    rank.owned_model = std::move(model).value();
    rank.model = rank.owned_model.get();
  }
  auto store = comm::TcpStoreClient::Connect(store_address, options_.comm_timeout);
  if (!store.ok()) return store.status();
  rank.store = std::move(store).value();
  absl::StatusOr<std::unique_ptr<comm::Communicator>> comm;
  if (on_gpus) {
    // Queued on the backend's stream: ordered with the ops, captured with the graphs.
    comm = comm::CreateNcclCommunicator({.rank = r,
                                         .world_size = n,
                                         .device = options_.cuda_device + r,
                                         .group_name = "tp",
                                         .timeout = options_.comm_timeout,
                                         .queue = rank.model->backend().queue()},
                                        *rank.store);
  } else {
    comm = comm::GlooCommunicator::Create(
        {.rank = r, .world_size = n, .group_name = "tp", .hostname = "127.0.0.1", .timeout = options_.comm_timeout},
        *rank.store);
  }
  if (!comm.ok()) return comm.status();
  rank.comm = std::make_unique<comm::TimedCommunicator>(std::move(comm).value());
  return absl::OkStatus();
}

CudaModelRunnerOptions TensorParallelRunner::RankCudaOptions(int32_t num_blocks) const {
  CudaModelRunnerOptions cuda = options_.cuda;
  cuda.block_size_tokens = options_.block_size_tokens;
  cuda.kv_cache_dtype = options_.kv_cache_dtype;
  cuda.kv_cache_bytes = 0;
  cuda.num_blocks = num_blocks;
  cuda.kv_cache_memory_fraction = num_blocks > 0 ? 0 : options_.kv_cache_memory_fraction;
  return cuda;
}

absl::StatusOr<int32_t> TensorParallelRunner::AgreeOnPoolBlocks(int32_t r, absl::StatusOr<int32_t> blocks) {
  std::unique_lock<std::mutex> lock(mu_);
  ranks_[r]->sized = true;
  ranks_[r]->pool_blocks = std::move(blocks);
  cv_.notify_all();
  cv_.wait(lock, [&] { return std::all_of(ranks_.begin(), ranks_.end(), [](const auto& rank) { return rank->sized; }); });
  if (!ranks_[r]->pool_blocks.ok()) return ranks_[r]->pool_blocks.status();
  int32_t smallest = INT32_MAX;
  for (const auto& rank : ranks_) {
    if (!rank->pool_blocks.ok()) return absl::FailedPreconditionError("another rank failed to start");
    smallest = std::min(smallest, *rank->pool_blocks);
  }
  if (smallest < 1)
    return absl::ResourceExhaustedError("the KV budget leaves a rank's GPU no room for one block of its pool");
  return smallest;
}

absl::Status TensorParallelRunner::SetUpRankRunner(int32_t r, int32_t num_blocks) {
  Rank& rank = *ranks_[r];
  if (options_.cuda_device >= 0) {
    auto runner = CreateCudaModelRunner(*rank.model, RankCudaOptions(num_blocks), rank.comm.get());
    if (!runner.ok()) return runner.status();
    rank.runner = std::move(runner).value();
  } else {
    auto runner = PagedModelRunner::Create(
        *rank.model,
        {.block_size_tokens = options_.block_size_tokens, .num_blocks = num_blocks,
         .kv_cache_dtype = options_.kv_cache_dtype},
        rank.comm.get());
    if (!runner.ok()) return runner.status();
    rank.runner = std::move(runner).value();
  }
  rank.layout = rank.runner->kv_pool_layout();
  if (!rank.layout.has_value()) return absl::InternalError("a rank's runner reports no KV pool layout");
  return absl::OkStatus();
}

TensorParallelRunner::~TensorParallelRunner() { StopFollowers(); }

void TensorParallelRunner::StopFollowers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& rank : ranks_) {
    if (rank->thread.joinable()) rank->thread.join();
  }
}

absl::StatusOr<ModelOutput> TensorParallelRunner::RunRank(int32_t r, const ModelBatch& batch, int64_t step) {
  Rank& rank = *ranks_[r];
  absl::StatusOr<ModelOutput> out;
  try {
    if (options_.before_rank_step) options_.before_rank_step(r, step);
    out = rank.runner->Execute(batch);
  } catch (const std::exception& e) {
    out = absl::InternalError(absl::StrCat("exception: ", e.what()));
  } catch (...) {
    out = absl::InternalError("unknown exception");
  }
  // Invalid batches are rejected by every rank before any collective: the group is intact.
  if (!out.ok() && out.status().code() != absl::StatusCode::kInvalidArgument) {
    // Closing this rank's connections turns the peers' pending collectives into errors
    // now rather than at the timeout. The runner is never used again (the group is broken).
    rank.comm.reset();
  }
  return out;
}

void TensorParallelRunner::FollowerLoop(int32_t r) {
  Rank& rank = *ranks_[r];
  int64_t seen = 0;
  while (true) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stopping_ || step_ > seen; });
    if (stopping_) return;
    seen = step_;
    lock.unlock();
    // NOTE: plan_ is not written again until every follower has reported this step.
    absl::StatusOr<ModelOutput> out;
    if (plan_streams_layers_) {
      // The driver's hook reads this rank's pool too: say when each layer is in it.
      ModelBatch batch = plan_;
      batch.on_layer_kv_written = [this, &rank](int32_t layer) {
        {
          std::lock_guard<std::mutex> guard(mu_);
          rank.layers_written = layer + 1;
        }
        cv_.notify_all();
      };
      out = RunRank(r, batch, seen);
    } else {
      out = RunRank(r, plan_, seen);
    }
    lock.lock();
    rank.done_step = seen;
    rank.step_status = out.status();
    lock.unlock();
    cv_.notify_all();
    if (!out.ok() && out.status().code() != absl::StatusCode::kInvalidArgument) return;  // group broken
  }
}

absl::StatusOr<ModelOutput> TensorParallelRunner::Execute(const ModelBatch& batch) {
  if (!group_status_.ok())
    return absl::FailedPreconditionError(
        absl::StrCat("tensor-parallel group is down (restart the worker): ", group_status_.message()));
  const int32_t n = tensor_parallel_size();
  int64_t step;
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan_.chunks = batch.chunks;
    plan_.swap_out = batch.swap_out;
    plan_.swap_in = batch.swap_in;
    plan_.block_copies = batch.block_copies;
    plan_.released_seq_ids = batch.released_seq_ids;  // every rank keeps its own tables
    plan_.layer_kv_read_blocks = batch.layer_kv_read_blocks;  // what GPU ranks mirror per layer
    plan_streams_layers_ = static_cast<bool>(batch.on_layer_kv_written);
    for (auto& rank : ranks_) rank->layers_written = 0;
    step = ++step_;
  }
  cv_.notify_all();
  absl::StatusOr<ModelOutput> out;
  if (batch.on_layer_kv_written) {
    // The hook reads every rank's share of a layer: it runs once all ranks wrote it (they
    // meet at each layer's all-reduce anyway, so rank 0 waits for little).
    ModelBatch driver = batch;
    driver.on_layer_kv_written = [this, &batch, step](int32_t layer) {
      WaitForLayerOnEveryRank(layer, step);
      batch.on_layer_kv_written(layer);
    };
    out = RunRank(0, driver, step);
  } else {
    out = RunRank(0, batch, step);
  }

  // Every follower finishes the step or fails within its collectives' timeout; the extra
  // bound catches a follower stuck outside any collective.
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(2 * options_.comm_timeout) +
                        std::chrono::seconds(5);
  std::vector<absl::Status> statuses(n);
  statuses[0] = out.status();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, deadline, [&] {
      return std::all_of(ranks_.begin() + 1, ranks_.end(), [&](const auto& rank) { return rank->done_step == step; });
    });
    for (int32_t r = 1; r < n; ++r) {
      statuses[r] = ranks_[r]->done_step == step
                        ? ranks_[r]->step_status
                        : absl::DeadlineExceededError("did not finish the step (stuck outside a collective)");
    }
  }
  const bool all_ok = std::all_of(statuses.begin(), statuses.end(), [](const absl::Status& s) { return s.ok(); });
  if (all_ok) return out;
  const bool all_rejected = std::all_of(statuses.begin(), statuses.end(), [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kInvalidArgument;
  });
  if (all_rejected) return out.status();
  const std::string message(CombineRankErrors(absl::StrCat("tensor-parallel step ", step, " failed"), statuses).message());
  group_status_ = absl::UnavailableError(message);
  KVMESH_LOG(kError) << message;
  if (options_.on_group_failure) options_.on_group_failure(group_status_);
  return group_status_;
}

void TensorParallelRunner::WaitForLayerOnEveryRank(int32_t layer, int64_t step) {
  // A follower that failed or is stuck ends the step in error, so nothing read early is
  // ever committed (the prefill's result is never delivered).
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(options_.comm_timeout);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [&] {
    return std::all_of(ranks_.begin() + 1, ranks_.end(),
                       [&](const auto& rank) { return rank->layers_written > layer || rank->done_step == step; });
  });
}

std::vector<kv::KvStorage*> TensorParallelRunner::kv_rank_storages() {
  std::vector<kv::KvStorage*> storages;
  for (auto& rank : ranks_) {
    const std::vector<kv::KvStorage*> own = rank->runner->kv_rank_storages();
    if (own.size() != 1) return {};  // a GPU rank without a host mirror
    storages.push_back(own[0]);
  }
  return storages;
}

absl::Status TensorParallelRunner::ForEachRank(const std::string& what,
                                               const std::function<absl::Status(int32_t)>& fn) {
  const int32_t n = tensor_parallel_size();
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int32_t r = 1; r < n; ++r) threads.emplace_back([&, r] { statuses[r] = fn(r); });
  statuses[0] = fn(0);
  for (std::thread& t : threads) t.join();
  return CombineRankErrors(what, statuses);
}

absl::Status TensorParallelRunner::CopyKvToHostMirror(std::span<const int32_t> blocks) {
  if (!group_status_.ok()) return group_status_;
  return ForEachRank("copying KV into the ranks' host mirrors",
                     [&](int32_t r) { return ranks_[r]->runner->CopyKvToHostMirror(blocks); });
}

absl::Status TensorParallelRunner::CopyKvFromHostMirror(std::span<const int32_t> blocks) {
  if (!group_status_.ok()) return group_status_;
  return ForEachRank("copying KV from the ranks' host mirrors",
                     [&](int32_t r) { return ranks_[r]->runner->CopyKvFromHostMirror(blocks); });
}

absl::Status TensorParallelRunner::health() const { return group_status_; }
double TensorParallelRunner::communication_seconds(int32_t rank) const {
  const comm::TimedCommunicator* c = ranks_[rank]->comm.get();
  return c == nullptr ? 0.0 : c->total_seconds();
}
int32_t TensorParallelRunner::vocab_size() const { return ranks_[0]->runner->vocab_size(); }
int32_t TensorParallelRunner::block_size_tokens() const { return ranks_[0]->runner->block_size_tokens(); }
int32_t TensorParallelRunner::num_blocks() const { return ranks_[0]->runner->num_blocks(); }
bool TensorParallelRunner::all_position_logits() const { return ranks_[0]->runner->all_position_logits(); }
bool TensorParallelRunner::returns_argmax() const { return ranks_[0]->runner->returns_argmax(); }
int64_t TensorParallelRunner::kv_swap_bytes_per_block() const { return ranks_[0]->runner->kv_swap_bytes_per_block(); }
KvSlotShape TensorParallelRunner::kv_slot_shape() const { return ranks_[0]->runner->kv_slot_shape(); }
const kv::KvLayout& TensorParallelRunner::rank_layout(int32_t rank) const { return *ranks_[rank]->layout; }
const LlamaModel& TensorParallelRunner::rank_model(int32_t rank) const { return *ranks_[rank]->model; }

std::string TensorParallelRunner::DescribeSharding() const {
  const LlamaModel& model = *ranks_[0]->model;
  const model::TensorParallelShard& s = model.shard();
  const kv::KvLayout& layout = rank_layout(0);
  const std::string where = options_.cuda_device < 0
                                ? std::string("CPU")
                                : absl::StrCat("GPUs ", options_.cuda_device, "..", options_.cuda_device + s.size - 1);
  return absl::StrCat("tensor parallel: ", s.size, " ranks on ", where, "; per rank ", s.num_heads, "/",
                      model.config().num_attention_heads, " query heads, ", s.num_kv_heads, "/",
                      model.config().num_key_value_heads, " KV heads",
                      s.kv_head_replication > 1 ? absl::StrCat(" (each KV head replicated on ", s.kv_head_replication,
                                                               " ranks)")
                                                : std::string(),
                      ", ", s.intermediate_size, " MLP rows, ", s.vocab_size, " vocab rows; KV pool ",
                      layout.num_blocks(), " blocks, ", layout.TotalBytes(), " bytes per rank");
}

}  // namespace kvmesh::engine
