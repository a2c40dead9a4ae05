// CudaModelRunner (see engine/cuda_model_runner.h).
//
// Per step: the host builds the step's metadata (engine/step_metadata.h) into one pinned
// buffer and copies it to the device in one transfer; the forward pass then runs on the
// backend's stream with device activations allocated once for the largest step; the
// wanted logits rows come back through pinned memory.
//
// Block tables stay on the device between steps (engine/block_tables.h): each kept
// sequence owns a row of table_rows_, a step uploads only the entries that changed (one
// per decode chunk, the block it writes into) and scatters them there, and the forward
// pass starts by gathering the step's table from the rows (step_staging.h).
//
// Decode steps are replayed from CUDA graphs, one per (batch-size bucket, context bucket):
// batch sizes 1, 2, 4, ... up to max_num_seqs, contexts 256, 512, 1024, ... up to
// max_model_len. A graph's metadata has a fixed layout (block-table rows as long as its
// context bucket; the batch padded to its bucket with rows whose KV slot is -1, so they
// write nothing), and its attention grid covers the context bucket (split-K partitions
// past a sequence's length exit at once). A bucket is captured after its first eager run,
// which also sizes every scratch buffer, so nothing allocates during capture.
//
// Under tensor parallelism (a TensorParallelRunner's GPU rank) the model is this rank's
// shard and the forward pass's collectives are queued by the NCCL communicator on the
// backend's stream, behind the ops and inside the decode graphs; every wait on that
// stream after the pass goes through the communicator (AwaitStream), so a lost peer
// ends the step with an error within its timeout instead of hanging it.
//
// A prefill or decode worker's runner keeps a host mirror of the pool (host_kv_mirror):
// the KV transports read and write that, and blocks cross PCIe as whole runs of
// consecutive ids, every layer of a run in one 2D copy (the pool and the mirror share
// their layout, so a run is one row per layer at the same offsets in both). During a
// streamed prefill's step each layer's finished blocks are copied right after the layer
// writes its KV, and the engine's hook for that layer runs once the copy has landed.
#include "engine/cuda_model_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "core/cuda_memory.h"
#include "core/logging.h"
#include "core/status_macros.h"
#include "engine/forward_pass.h"
#include "engine/step_metadata.h"
#include "engine/step_staging.h"
#include "kv/kv_layout.h"
#include "kv/transport/kv_runs.h"

namespace kvmesh::engine {
namespace {

using cuda::AllocateDevice;
using cuda::AllocatePinnedHost;
using cuda::CudaStatus;
using cuda::DeviceMemory;
using cuda::PinnedHostMemory;

// What one forward pass runs over: `rows` token rows of `seqs` sequences (metadata at
// `meta` on the device), `logit_rows` of them through the LM head.
struct ForwardShape {
  int64_t rows = 0, seqs = 0, logit_rows = 0;
  int32_t max_blocks_per_seq = 0, max_query_len = 0, max_context_len = 0;
};

class CudaModelRunner : public ModelRunner {
 public:
  CudaModelRunner(LlamaModel& model, int device, kv::KvLayout layout, const CudaModelRunnerOptions& options,
                  comm::Communicator* comm)
      : model_(model),
        be_(model.backend()),
        comm_(comm),
        world_size_(comm != nullptr ? comm->world_size() : 1),
        stream_(static_cast<cudaStream_t>(be_.queue())),
        device_(device),
        layout_(layout),
        options_(options),
        max_blocks_per_seq_((options.max_model_len + layout.block_size_tokens() - 1) / layout.block_size_tokens()),
        tables_({.num_pool_blocks = layout.num_blocks(),
                 // Kept sequences plus one step's sequences sent whole without a seq_id.
                 .max_rows = static_cast<int32_t>(2 * options.max_num_seqs),
                 .max_blocks_per_row = max_blocks_per_seq_}) {}
  ~CudaModelRunner() override {
    // A tensor-parallel group is torn down from one thread: free on this rank's GPU.
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    for (auto& [key, g] : graphs_) {
      if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
    }
    for (cudaEvent_t event : layer_mirrored_) cudaEventDestroy(event);
    if (mirror_registered_) cudaHostUnregister(mirror_->data());
  }

  absl::Status Init();
  int32_t vocab_size() const override { return static_cast<int32_t>(model_.config().vocab_size); }
  int32_t block_size_tokens() const override { return layout_.block_size_tokens(); }
  int32_t num_blocks() const override { return layout_.num_blocks(); }
  absl::StatusOr<ModelOutput> Execute(const ModelBatch& batch) override;
  bool returns_argmax() const override { return true; }
  bool keeps_block_tables() const override { return true; }
  // A host-tier slot holds a block's every layer, layer-major, and under tensor
  // parallelism every rank's share of them, rank-major (model_runner.h).
  int64_t kv_swap_bytes_per_block() const override { return RankSwapBytes() * world_size_; }
  KvSlotShape kv_slot_shape() const override {
    return {.num_layers = layout_.num_layers() * world_size_,
            .block_bytes = layout_.BlockBytes(),
            .dtype = static_cast<int32_t>(layout_.dtype())};
  }
  std::optional<kv::KvLayout> kv_pool_layout() override { return layout_; }
  std::vector<kv::KvStorage*> kv_rank_storages() override {
    return mirror_ == nullptr ? std::vector<kv::KvStorage*>{} : std::vector<kv::KvStorage*>{mirror_.get()};
  }
  absl::Status CopyKvToHostMirror(std::span<const int32_t> blocks) override { return CopyMirror(blocks, true); }
  absl::Status CopyKvFromHostMirror(std::span<const int32_t> blocks) override { return CopyMirror(blocks, false); }

 private:
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    bool capture_failed = false;  // this bucket runs eagerly
  };

  // This rank's share of a host-tier slot.
  int64_t RankSwapBytes() const { return static_cast<int64_t>(layout_.num_layers()) * layout_.BlockBytes(); }
  // Waits for the backend's stream up to `event` (nullptr: all of it): through the
  // communicator when its collectives are queued there (bounded by its timeout), then
  // for the stream's own errors.
  absl::Status AwaitStream(const char* what, cudaEvent_t event = nullptr);
  absl::Status UploadWeights();
  absl::Status CreateMirror();
  // `blocks` as runs of consecutive ids (sorted, each block once); InvalidArgument for a
  // block outside the pool, or FailedPrecondition without a mirror.
  absl::StatusOr<std::vector<kv::KvRun>> MirrorRuns(std::span<const int32_t> blocks) const;
  // Queues one layer's (or, with layer < 0, every layer's) copy of `runs` between the pool
  // and the mirror on the backend's stream.
  cudaError_t QueueMirrorCopy(const std::vector<kv::KvRun>& runs, int32_t layer, bool to_host);
  absl::Status CopyMirror(std::span<const int32_t> blocks, bool to_host);
  absl::Status RunBlockCopies(const std::vector<KvBlockCopy>& copies);
  // Scatters all but the last meta_layout_.max_table_updates of `*updates` into
  // table_rows_ now, in rounds through the staging buffer, and leaves the rest in
  // *updates for the step's own upload.
  absl::Status ApplyTableUpdatesAhead(std::span<const BlockTableUpdate>* updates);
  // Moves whole blocks between the device pool and host-tier slots (pool -> host when
  // `to_host`), then waits for them: the engine checksums a slot as soon as Execute
  // returns. Returns the seconds the copies took.
  absl::StatusOr<double> RunSwaps(const std::vector<KvBlockSwap>& swaps, bool to_host);
  // Queues the forward pass (engine/forward_pass.h) over the metadata at meta_device_ on
  // the backend's stream. With `mirrored`, each layer's copy of those runs into the mirror
  // follows its KV write, and layer_mirrored_[layer] is recorded after it.
  absl::Status Forward(const ForwardShape& f, const std::vector<kv::KvRun>* mirrored = nullptr);
  // Captures Forward(shape) into graph->exec. On failure the stream is out of capture mode
  // and no error is left pending.
  absl::Status Capture(const ForwardShape& shape, Graph* graph);
  template <typename T>
  T* Meta(size_t offset) const {
    return reinterpret_cast<T*>(meta_device_.as<std::byte>() + offset);
  }
  template <typename T>
  T* HostMeta(size_t offset) const {
    return reinterpret_cast<T*>(meta_host_.as<std::byte>() + offset);
  }
  // The device pool and the kept block-table rows as the backend's ops take them.
  backend::Backend::BlockPool Pool() const {
    return {.data = pool_.as<std::byte>(),
            .num_layers = layout_.num_layers(),
            .layer_bytes = layout_.LayerBytes(),
            .block_bytes = layout_.BlockBytes()};
  }
  std::span<int32_t> TableRows() const {
    return {table_rows_.as<int32_t>(), table_rows_.bytes() / sizeof(int32_t)};
  }
  // Queues the scatter of the first n (index, block) updates staged on the device.
  void ScatterTableUpdates(int64_t n) {
    be_.ScatterPairs({Meta<int32_t>(meta_layout_.table_updates), static_cast<size_t>(2 * n)}, TableRows());
  }

  // The backend's queue() is its CUDA stream: this runner's copies, uploads and graph
  // captures are ordered on it with the ops.
  LlamaModel& model_;
  backend::Backend& be_;
  comm::Communicator* const comm_;  // nullptr without tensor parallelism
  const int32_t world_size_;
  const cudaStream_t stream_;
  const int device_;
  const kv::KvLayout layout_;
  const CudaModelRunnerOptions options_;
  const int32_t max_blocks_per_seq_;  // blocks of max_model_len: the rows' stride
  StepMetadata meta_;
  BlockTables tables_;                      // the host's copy of table_rows_
  std::vector<BlockTableUpdate> table_updates_;
  // Set while table_rows_ may lack updates tables_ holds (a step failed between Apply and
  // the scatter): the next step rewrites every kept row.
  bool table_rows_stale_ = false;
  DeviceMemory table_rows_;  // [2 * max_num_seqs, max_blocks_per_seq_] int32: the kept tables

  DeviceMemory pool_;  // the KV pool, kv_layout.h's layout, all layers
  // host_kv_mirror: the pool's host mirror, registered with CUDA, and one event per layer
  // recorded once a streamed step's copy of that layer into it is queued.
  std::unique_ptr<kv::KvStorage> mirror_;
  bool mirror_registered_ = false;
  std::vector<cudaEvent_t> layer_mirrored_;
  DeviceMemory embed_, final_norm_, inv_freq_;
  std::vector<DeviceMemory> input_norms_, post_norms_;  // f32 [hidden] per layer
  StagingLayout meta_layout_;
  DeviceMemory meta_device_;
  PinnedHostMemory meta_host_;
  std::unique_ptr<ForwardPass> forward_;  // over the device weights, reserved for the largest step
  DeviceMemory logits_;
  PinnedHostMemory logits_host_;
  DeviceMemory argmax_;             // [max_num_seqs] int32: each LM head row's greedy token
  PinnedHostMemory argmax_host_;
  std::map<std::pair<int64_t, int32_t>, Graph> graphs_;  // by (batch bucket, context bucket)
};

absl::Status CudaModelRunner::UploadWeights() {
  const model::ModelWeights& w = model_.weights();
  auto upload = [](const TensorView& host, bool widen_to_f32, absl::string_view what) -> absl::StatusOr<DeviceMemory> {
    if (!host.is_contiguous()) return absl::InvalidArgumentError(absl::StrCat(what, " is not contiguous"));
    std::vector<float> widened;
    const void* src = host.data;
    size_t bytes = static_cast<size_t>(host.num_bytes());
    if (widen_to_f32 && host.dtype != DType::kF32) {
      widened.resize(static_cast<size_t>(host.num_elements()));
      for (size_t i = 0; i < widened.size(); ++i)
        widened[i] = LoadAsF32(host.data, host.dtype, static_cast<int64_t>(i));
      src = widened.data();
      bytes = sizeof(float) * widened.size();
    }
    KVMESH_ASSIGN_OR_RETURN(DeviceMemory d, AllocateDevice(bytes, what));
    KVMESH_RETURN_IF_CUDA_ERROR(cudaMemcpy(d.get(), src, bytes, cudaMemcpyHostToDevice),
                                absl::StrCat("uploading ", what));
    return d;
  };
  if (w.embed_tokens.dtype != DType::kF32 && w.embed_tokens.dtype != DType::kBF16 &&
      w.embed_tokens.dtype != DType::kF16)
    return absl::InvalidArgumentError("the embedding table must be f32, bf16 or f16");
  KVMESH_ASSIGN_OR_RETURN(embed_, upload(w.embed_tokens, false, "the embedding table"));
  // Norm weights are tiny: f32 on the device whatever the model's dtype (exact widening).
  KVMESH_ASSIGN_OR_RETURN(final_norm_, upload(w.norm, true, "the final norm"));
  for (const model::LayerWeights& layer : w.layers) {
    KVMESH_ASSIGN_OR_RETURN(DeviceMemory in, upload(layer.input_layernorm, true, "an input norm"));
    KVMESH_ASSIGN_OR_RETURN(DeviceMemory post, upload(layer.post_attention_layernorm, true, "a post-attention norm"));
    input_norms_.push_back(std::move(in));
    post_norms_.push_back(std::move(post));
  }
  const std::span<const float> inv_freq = model_.rope_inv_freq();
  KVMESH_ASSIGN_OR_RETURN(inv_freq_, AllocateDevice(sizeof(float) * inv_freq.size(), "RoPE frequencies"));
  KVMESH_RETURN_IF_CUDA_ERROR(
      cudaMemcpy(inv_freq_.get(), inv_freq.data(), sizeof(float) * inv_freq.size(), cudaMemcpyHostToDevice),
      "uploading RoPE frequencies");
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Init() {
  const model::ModelConfig& c = model_.config();
  const int64_t t = options_.max_num_tokens, s = options_.max_num_seqs;
  // This rank's heads, MLP rows and embedding rows (all of them without TP); the logits
  // are the whole vocabulary's (the pass gathers every rank's).
  const model::TensorParallelShard& shard = model_.shard();
  const int64_t e = c.hidden_size, d = c.head_dim, h = shard.num_heads, hkv = shard.num_kv_heads;
  const int64_t inter = shard.intermediate_size, vocab = c.vocab_size;
  KVMESH_RETURN_IF_ERROR(UploadWeights());
  ForwardWeights weights{
      .embed_tokens = TensorView::Contiguous(embed_.get(), model_.weights().embed_tokens.dtype, {shard.vocab_size, e}),
      .final_norm = TensorView::Contiguous(final_norm_.get(), DType::kF32, {e}),
      .rope_inv_freq = {inv_freq_.as<float>(), static_cast<size_t>(d / 2)}};
  for (size_t l = 0; l < input_norms_.size(); ++l) {
    weights.input_norms.push_back(TensorView::Contiguous(input_norms_[l].get(), DType::kF32, {e}));
    weights.post_norms.push_back(TensorView::Contiguous(post_norms_[l].get(), DType::kF32, {e}));
  }
  forward_ = std::make_unique<ForwardPass>(model_, std::move(weights), comm_);
  KVMESH_ASSIGN_OR_RETURN(pool_, AllocateDevice(static_cast<size_t>(layout_.TotalBytes()), "the KV pool"));
  // Zeroed so that padded graph rows, which read block 0, read finite numbers.
  KVMESH_RETURN_IF_CUDA_ERROR(cudaMemset(pool_.get(), 0, pool_.bytes()), "clearing the KV pool");
  if (options_.host_kv_mirror) KVMESH_RETURN_IF_ERROR(CreateMirror());
  const int64_t max_blocks = max_blocks_per_seq_;
  const int64_t table_entries = int64_t{tables_.options().max_rows} * max_blocks;
  if (table_entries > INT32_MAX)
    return absl::InvalidArgumentError(absl::StrCat("block-table rows of ", table_entries,
                                                   " entries overflow int32 indices: lower max_num_seqs or max_model_len"));
  KVMESH_ASSIGN_OR_RETURN(table_rows_, AllocateDevice(sizeof(int32_t) * table_entries, "block-table rows"));
  // Block copies per step: at most one per sequence forked this step; be generous. Table
  // updates: a decode step has one per sequence; more (new sequences' whole tables, a
  // rewrite after a failed step) go ahead in rounds of this many (ApplyTableUpdatesAhead).
  meta_layout_ = StagingLayout::For(t, s, max_blocks, std::max<int64_t>(64 * s, 8 * max_blocks), 4 * s);
  KVMESH_ASSIGN_OR_RETURN(meta_device_, AllocateDevice(meta_layout_.total, "step metadata"));
  KVMESH_ASSIGN_OR_RETURN(meta_host_, AllocatePinnedHost(meta_layout_.total, "step metadata staging"));
  // Every step's activations now, so that nothing allocates during a graph capture.
  KVMESH_RETURN_IF_ERROR(forward_->Reserve(t, s));
  KVMESH_ASSIGN_OR_RETURN(logits_, AllocateDevice(sizeof(float) * s * vocab, "logits"));
  KVMESH_ASSIGN_OR_RETURN(logits_host_, AllocatePinnedHost(sizeof(float) * s * vocab, "logits staging"));
  KVMESH_ASSIGN_OR_RETURN(argmax_, AllocateDevice(sizeof(int32_t) * s, "greedy tokens"));
  KVMESH_ASSIGN_OR_RETURN(argmax_host_, AllocatePinnedHost(sizeof(int32_t) * s, "greedy tokens staging"));
  const int64_t widest = std::max({e, h * d, inter});
  KVMESH_RETURN_IF_ERROR(be_.ReserveWorkspace({.max_tokens = t,
                                               .max_width = widest,
                                               .max_seqs = s,
                                               .num_heads = static_cast<int32_t>(h),
                                               .num_kv_heads = static_cast<int32_t>(hkv),
                                               .head_dim = static_cast<int32_t>(d),
                                               .max_context_len = std::max(options_.max_model_len, 1)}));
  KVMESH_RETURN_IF_CUDA_ERROR(cudaDeviceSynchronize(), "initializing the CUDA runner");
  return absl::OkStatus();
}

absl::Status CudaModelRunner::CreateMirror() {
  absl::StatusOr<std::unique_ptr<kv::KvStorage>> mirror =
      kv::KvStorage::Create({.num_layers = layout_.num_layers(),
                             .num_kv_heads = layout_.num_kv_heads(),
                             .kv_head_replication = layout_.kv_head_replication(),
                             .head_dim = layout_.head_dim(),
                             .block_size_tokens = layout_.block_size_tokens(),
                             .dtype = layout_.dtype(),
                             .num_blocks = layout_.num_blocks()});
  if (!mirror.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("the host mirror of the KV pool (", layout_.TotalBytes(),
                                                     " bytes, the device pool's size) cannot be allocated: ",
                                                     mirror.status().message(), "; lower --kv-cache-bytes"));
  }
  mirror_ = *std::move(mirror);
  KVMESH_RETURN_IF_CUDA_ERROR(cudaHostRegister(mirror_->data(), static_cast<size_t>(mirror_->size_bytes()),
                                               cudaHostRegisterPortable),
                              "pinning the KV pool's host mirror");
  mirror_registered_ = true;
  layer_mirrored_.resize(static_cast<size_t>(layout_.num_layers()), nullptr);
  for (cudaEvent_t& event : layer_mirrored_) {
    KVMESH_RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                "creating the KV mirror's layer events");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<kv::KvRun>> CudaModelRunner::MirrorRuns(std::span<const int32_t> blocks) const {
  if (mirror_ == nullptr) {
    return absl::FailedPreconditionError(
        "this CUDA runner keeps no host mirror of its KV pool (a worker has one with --role prefill or decode)");
  }
  std::vector<kv::BlockId> ids;
  ids.reserve(blocks.size());
  for (const int32_t b : blocks) {
    if (b < 0 || b >= num_blocks())
      return absl::InvalidArgumentError(absl::StrCat("KV block ", b, " is outside the pool of ", num_blocks()));
    ids.push_back(kv::BlockId{b});
  }
  std::sort(ids.begin(), ids.end(), [](kv::BlockId a, kv::BlockId b) { return a.value < b.value; });
  ids.erase(std::unique(ids.begin(), ids.end(), [](kv::BlockId a, kv::BlockId b) { return a.value == b.value; }),
            ids.end());
  return kv::MergeKvRuns(ids, ids);
}

cudaError_t CudaModelRunner::QueueMirrorCopy(const std::vector<kv::KvRun>& runs, int32_t layer, bool to_host) {
  const int32_t first_layer = layer < 0 ? 0 : layer;
  const size_t height = layer < 0 ? static_cast<size_t>(layout_.num_layers()) : 1;
  const size_t pitch = static_cast<size_t>(layout_.LayerBytes());
  for (const kv::KvRun& run : runs) {
    const int64_t offset = layout_.BlockOffset(first_layer, run.src_first);
    std::byte* device = pool_.as<std::byte>() + offset;
    std::byte* host = mirror_->data() + offset;
    const size_t width = static_cast<size_t>(run.num_blocks) * static_cast<size_t>(layout_.BlockBytes());
    const cudaError_t queued =
        to_host ? cudaMemcpy2DAsync(host, pitch, device, pitch, width, height, cudaMemcpyDeviceToHost, stream_)
                : cudaMemcpy2DAsync(device, pitch, host, pitch, width, height, cudaMemcpyHostToDevice, stream_);
    if (queued != cudaSuccess) return queued;
  }
  return cudaSuccess;
}

absl::Status CudaModelRunner::CopyMirror(std::span<const int32_t> blocks, bool to_host) {
  KVMESH_ASSIGN_OR_RETURN(const std::vector<kv::KvRun> runs, MirrorRuns(blocks));
  if (runs.empty()) return absl::OkStatus();
  const char* what = to_host ? "copying KV blocks into the host mirror" : "copying KV blocks from the host mirror";
  KVMESH_RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "selecting the runner's GPU");
  KVMESH_RETURN_IF_CUDA_ERROR(QueueMirrorCopy(runs, /*layer=*/-1, to_host), what);
  KVMESH_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), what);
  return absl::OkStatus();
}

absl::Status CudaModelRunner::RunBlockCopies(const std::vector<KvBlockCopy>& copies) {
  if (copies.empty()) return absl::OkStatus();
  const size_t capacity = (meta_layout_.total - meta_layout_.block_copies) / (2 * sizeof(int32_t));
  int32_t* host = HostMeta<int32_t>(meta_layout_.block_copies);
  for (size_t begin = 0; begin < copies.size(); begin += capacity) {
    // The previous batch's upload must be done before its staging is rewritten.
    if (begin > 0) KVMESH_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "copying KV blocks");
    const size_t n = std::min(capacity, copies.size() - begin);
    for (size_t i = 0; i < n; ++i) {
      host[2 * i] = copies[begin + i].src;
      host[2 * i + 1] = copies[begin + i].dst;
      if (copies[begin + i].src < 0 || copies[begin + i].src >= num_blocks() || copies[begin + i].dst < 0 ||
          copies[begin + i].dst >= num_blocks())
        return absl::InvalidArgumentError("a block copy names a block outside the pool");
    }
    KVMESH_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(Meta<int32_t>(meta_layout_.block_copies), host,
                                                sizeof(int32_t) * 2 * n, cudaMemcpyHostToDevice, stream_),
                                "uploading block copies");
    be_.CopyBlocks(Pool(), {Meta<int32_t>(meta_layout_.block_copies), 2 * n});
  }
  return absl::OkStatus();
}

absl::Status CudaModelRunner::ApplyTableUpdatesAhead(std::span<const BlockTableUpdate>* updates) {
  const size_t round = static_cast<size_t>(meta_layout_.max_table_updates);
  cudaStream_t stream = stream_;
  while (updates->size() > round) {
    std::memcpy(HostMeta<BlockTableUpdate>(meta_layout_.table_updates), updates->data(),
                sizeof(BlockTableUpdate) * round);
    KVMESH_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(Meta<BlockTableUpdate>(meta_layout_.table_updates),
                                                HostMeta<BlockTableUpdate>(meta_layout_.table_updates),
                                                sizeof(BlockTableUpdate) * round, cudaMemcpyHostToDevice, stream),
                                "uploading block-table updates");
    ScatterTableUpdates(static_cast<int64_t>(round));
    // The staging is rewritten by the next round (or the step).
    KVMESH_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream), "updating the kept block tables");
    KVMESH_RETURN_IF_ERROR(be_.TakeError());
    *updates = updates->subspan(round);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CudaModelRunner::RunSwaps(const std::vector<KvBlockSwap>& swaps, bool to_host) {
  if (swaps.empty()) return 0.0;
  const auto start = std::chrono::steady_clock::now();
  const backend::Backend::BlockPool pool = Pool();
  // The pairs live in the pinned metadata buffer, which the backend reads in place
  // (ops.h); RunBlockCopies reuses it, so the swaps are waited for below.
  const size_t capacity = (meta_layout_.total - meta_layout_.block_copies) / (2 * sizeof(int32_t));
  int32_t* pairs = HostMeta<int32_t>(meta_layout_.block_copies);
  // Under TP the slot holds every rank's heads; this rank's share is at rank * its size.
  const int64_t offset = comm_ != nullptr ? comm_->rank() * RankSwapBytes() : 0;
  for (size_t begin = 0; begin < swaps.size(); begin += capacity) {
    if (begin > 0) KVMESH_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "swapping KV blocks");
    const size_t n = std::min(capacity, swaps.size() - begin);
    for (size_t i = 0; i < n; ++i) {
      const KvBlockSwap& swap = swaps[begin + i];
      if (swap.block < 0 || swap.block >= num_blocks() || swap.host == nullptr)
        return absl::InvalidArgumentError(absl::StrCat("a KV swap names block ", swap.block, " outside the pool ",
                                                       "or no host slot"));
      pairs[2 * i] = to_host ? swap.block : 0;
      pairs[2 * i + 1] = to_host ? 0 : swap.block;
      // A slot (every layer of one block) is a pool of one block per layer.
      const backend::Backend::BlockPool slot{.data = swap.host + offset,
                                             .num_layers = pool.num_layers,
                                             .layer_bytes = pool.block_bytes,
                                             .block_bytes = pool.block_bytes};
      be_.SwapBlocks(to_host ? pool : slot, to_host ? slot : pool, {pairs + 2 * i, 2});
    }
  }
  KVMESH_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "swapping KV blocks");
  // The engine checksums or registers the slots as soon as this returns.
  KVMESH_RETURN_IF_ERROR(be_.TakeError());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::Status CudaModelRunner::Forward(const ForwardShape& f, const std::vector<kv::KvRun>* mirrored) {
  const int64_t t = f.rows, r = f.logit_rows;
  cudaStream_t stream = stream_;
  // The step's block table from the kept rows (a graph replays this too: the rows it reads
  // are the step's, from the metadata).
  be_.GatherTableRows(TableRows(), max_blocks_per_seq_, {Meta<int32_t>(meta_layout_.table_rows), static_cast<size_t>(f.seqs)},
                      {Meta<int32_t>(meta_layout_.context_lens), static_cast<size_t>(f.seqs)},
                      layout_.block_size_tokens(),
                      {Meta<int32_t>(meta_layout_.block_tables), static_cast<size_t>(f.seqs * f.max_blocks_per_seq)});
  ForwardStep step{
      .num_tokens = t,
      .token_ids = {Meta<int32_t>(meta_layout_.token_ids), static_cast<size_t>(t)},
      .positions = {Meta<int32_t>(meta_layout_.positions), static_cast<size_t>(t)},
      .slots = {Meta<int64_t>(meta_layout_.slots), static_cast<size_t>(t)},
      .attention = {.query_start = {Meta<int32_t>(meta_layout_.query_start), static_cast<size_t>(f.seqs + 1)},
                    .context_lens = {Meta<int32_t>(meta_layout_.context_lens), static_cast<size_t>(f.seqs)},
                    .block_tables = {Meta<int32_t>(meta_layout_.block_tables),
                                     static_cast<size_t>(f.seqs * f.max_blocks_per_seq)},
                    .max_blocks_per_seq = f.max_blocks_per_seq,
                    .max_query_len = f.max_query_len,
                    .max_context_len = f.max_context_len},
      .logit_rows = {Meta<int32_t>(meta_layout_.logit_rows), static_cast<size_t>(r)},
      .logits = TensorView::Contiguous(logits_.get(), DType::kF32, {r, model_.config().vocab_size}),
      // Every row's greedy token too (a pass over logits the GEMM just wrote): argmax_only
      // chunks then copy one id to the host instead of their row.
      .argmax = {argmax_.as<int32_t>(), static_cast<size_t>(r)},
      .kv_cache =
          [this](int32_t layer) {
            return TensorView::Contiguous(pool_.as<std::byte>() + int64_t{layer} * layout_.LayerBytes(),
                                          layout_.dtype(),
                                          {layout_.num_blocks(), 2, layout_.num_kv_heads(),
                                           layout_.block_size_tokens(), layout_.head_dim()});
          },
  };
  if (mirrored != nullptr) {
    step.after_kv_write = [this, mirrored, stream](int32_t layer) {
      // NOTE: on the compute stream: the copy is one layer's new blocks (a few MB against
      // the layer's GEMMs), and the stream orders it after the write without an event.
      if (absl::Status s = CudaStatus(QueueMirrorCopy(*mirrored, layer, /*to_host=*/true),
                                      "copying a layer's KV into the host mirror");
          !s.ok()) {
        be_.RecordError(std::move(s));
      }
      if (absl::Status s = CudaStatus(cudaEventRecord(layer_mirrored_[static_cast<size_t>(layer)], stream),
                                      "marking a layer's KV mirrored");
          !s.ok()) {
        be_.RecordError(std::move(s));
      }
    };
  }
  return forward_->Run(step);
}

absl::Status CudaModelRunner::AwaitStream(const char* what, cudaEvent_t event) {
  if (comm_ != nullptr) KVMESH_RETURN_IF_ERROR(comm_->AwaitQueue(event));
  KVMESH_RETURN_IF_CUDA_ERROR(event != nullptr ? cudaEventSynchronize(event) : cudaStreamSynchronize(stream_), what);
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Capture(const ForwardShape& shape, Graph* graph) {
  cudaStream_t stream = stream_;
  cudaGraph_t captured = nullptr;
  KVMESH_RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                              "starting a decode graph capture");
  const absl::Status forward = Forward(shape);
  const cudaError_t end = cudaStreamEndCapture(stream, &captured);  // ends the capture even after a failure
  absl::Status recorded = be_.TakeError();
  if (recorded.ok()) recorded = forward;
  if (end != cudaSuccess || !recorded.ok()) {
    if (captured != nullptr) cudaGraphDestroy(captured);
    cudaGetLastError();  // the capture's error is not the next step's
    return end != cudaSuccess ? CudaStatus(end, "capturing a decode graph") : recorded;
  }
  const cudaError_t inst = cudaGraphInstantiate(&graph->exec, captured, 0);
  cudaGraphDestroy(captured);
  if (inst != cudaSuccess) {
    graph->exec = nullptr;
    cudaGetLastError();
    return CudaStatus(inst, "instantiating a decode graph");
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelOutput> CudaModelRunner::Execute(const ModelBatch& batch) {
  ModelOutput output;
  // First, before anything can fail: the scheduler counts on every batch's table deltas
  // and releases being applied, whatever becomes of the step.
  table_updates_.clear();
  KVMESH_RETURN_IF_ERROR(tables_.Apply(batch, &table_updates_));
  if (table_rows_stale_) {
    table_updates_.clear();
    tables_.AppendAllEntries(&table_updates_);
  }
  // Until the scatter below is queued, the device rows lack these updates.
  table_rows_stale_ = table_rows_stale_ || !table_updates_.empty();
  if (!batch.swap_out.empty() || !batch.swap_in.empty()) {
    KVMESH_RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "selecting the runner's GPU");
    // Order (model_runner.h): swap_out first (a block offloaded as it is evicted may be
    // reused by a chunk of this step), then swap_in.
    KVMESH_ASSIGN_OR_RETURN(output.swap_out_seconds, RunSwaps(batch.swap_out, /*to_host=*/true));
    KVMESH_ASSIGN_OR_RETURN(output.swap_in_seconds, RunSwaps(batch.swap_in, /*to_host=*/false));
  }
  if (batch.chunks.empty()) return output;
  // A streamed prefill's step: which blocks each layer copies into the mirror.
  std::vector<kv::KvRun> mirrored;
  if (batch.on_layer_kv_written) {
    KVMESH_ASSIGN_OR_RETURN(mirrored, MirrorRuns(batch.layer_kv_read_blocks));
  }
  KVMESH_RETURN_IF_ERROR(
      BuildStepMetadata(batch, tables_, block_size_tokens(), vocab_size(), /*with_block_tables=*/false, &meta_));
  // The current device is per thread, and the engine's thread need not be the loader's.
  KVMESH_RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "selecting the runner's GPU");
  const int64_t t = static_cast<int64_t>(meta_.token_ids.size());
  const int64_t s = static_cast<int64_t>(batch.chunks.size());
  if (t > options_.max_num_tokens || s > options_.max_num_seqs)
    return absl::InvalidArgumentError(absl::StrCat("a step of ", t, " tokens in ", s,
                                                   " sequences exceeds the runner's ", options_.max_num_tokens,
                                                   " tokens / ", options_.max_num_seqs, " sequences"));
  if (meta_.max_context_len > options_.max_model_len)
    return absl::InvalidArgumentError(
        absl::StrCat("context of ", meta_.max_context_len, " tokens exceeds max_model_len ", options_.max_model_len));
  KVMESH_RETURN_IF_ERROR(RunBlockCopies(batch.block_copies));
  std::span<const BlockTableUpdate> step_updates = table_updates_;
  KVMESH_RETURN_IF_ERROR(ApplyTableUpdatesAhead(&step_updates));

  // Decode steps use the graph layout (padded bucket, fixed block-table rows); others
  // the step's own sizes (step_staging.h).
  const StagedStep staged =
      StageStep(meta_, batch, step_updates, meta_layout_,
                {.max_num_seqs = options_.max_num_seqs,
                 .max_model_len = options_.max_model_len,
                 .block_size_tokens = block_size_tokens()},
                meta_host_.as<std::byte>());
  const bool decode = staged.decode;
  const int64_t seqs = staged.seqs;
  const int32_t max_context = staged.max_context_len;
  const std::vector<int32_t>& wanted = staged.wanted;
  cudaStream_t stream = stream_;
  KVMESH_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(meta_device_.get(), meta_host_.get(), staged.upload_bytes,
                                              cudaMemcpyHostToDevice, stream),
                              "uploading step metadata");
  ScatterTableUpdates(staged.num_table_updates);
  table_rows_stale_ = false;

  const ForwardShape shape{.rows = staged.rows,
                           .seqs = staged.seqs,
                           .logit_rows = staged.logit_rows,
                           .max_blocks_per_seq = staged.max_blocks_per_seq,
                           .max_query_len = staged.max_query_len,
                           .max_context_len = staged.max_context_len};
  // A streamed step runs eagerly: its layers' mirror copies are not in the graphs.
  const bool streamed = static_cast<bool>(batch.on_layer_kv_written);
  Graph* graph = decode && !streamed && options_.enable_cuda_graphs ? &graphs_[{seqs, max_context}] : nullptr;
  if (graph != nullptr && graph->exec != nullptr) {
    KVMESH_RETURN_IF_CUDA_ERROR(cudaGraphLaunch(graph->exec, stream), "replaying a decode graph");
  } else {
    KVMESH_RETURN_IF_ERROR(Forward(shape, streamed ? &mirrored : nullptr));
    if (graph != nullptr && !graph->capture_failed) {
      // This eager run sized every scratch buffer; capture the bucket for later steps.
      // The capture records the same work without running it (this step's result is the
      // eager run's).
      KVMESH_RETURN_IF_ERROR(be_.TakeError());
      KVMESH_RETURN_IF_ERROR(AwaitStream("a decode step"));
      if (absl::Status captured = Capture(shape, graph); !captured.ok()) {
        // A bucket that cannot be captured runs eagerly from now on: slower, not wrong.
        graph->capture_failed = true;
        KVMESH_LOG(kWarning) << "decode steps of this batch and context bucket run without a CUDA graph"
                             << LogKv("batch", seqs) << LogKv("context", max_context)
                             << LogKv("error", captured.message());
      }
    }
  }
  if (streamed) {
    // Each layer's hook once its blocks are in the mirror, while later layers compute.
    KVMESH_RETURN_IF_ERROR(be_.TakeError());
    for (size_t l = 0; l < layer_mirrored_.size(); ++l) {
      KVMESH_RETURN_IF_ERROR(AwaitStream("copying a layer's KV into the host mirror", layer_mirrored_[l]));
      batch.on_layer_kv_written(static_cast<int32_t>(l));
    }
  }
  // wanted[k] is the LM head row of the k-th chunk with compute_logits; argmax_only ones
  // take its greedy token, the others its logits.
  std::vector<int32_t> logits_rows, argmax_rows;
  size_t k = 0;
  for (const SequenceChunk& chunk : batch.chunks) {
    if (!chunk.compute_logits) continue;
    (chunk.argmax_only ? argmax_rows : logits_rows).push_back(wanted[k++]);
  }
  const int64_t vocab = vocab_size();
  // Only rows up to the last one needed cross PCIe (a padded bucket's tail does not).
  if (!logits_rows.empty()) {
    KVMESH_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(logits_host_.get(), logits_.get(),
                                                sizeof(float) * static_cast<size_t>((logits_rows.back() + 1) * vocab),
                                                cudaMemcpyDeviceToHost, stream),
                                "copying logits to the host");
  }
  if (!argmax_rows.empty()) {
    KVMESH_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(argmax_host_.get(), argmax_.get(),
                                                sizeof(int32_t) * static_cast<size_t>(argmax_rows.back() + 1),
                                                cudaMemcpyDeviceToHost, stream),
                                "copying greedy tokens to the host");
  }
  KVMESH_RETURN_IF_ERROR(AwaitStream("a model step on the GPU"));
  KVMESH_RETURN_IF_ERROR(be_.TakeError());
  output.logits.resize(logits_rows.size() * static_cast<size_t>(vocab));
  for (size_t i = 0; i < logits_rows.size(); ++i) {
    std::memcpy(output.logits.data() + i * vocab, logits_host_.as<float>() + int64_t{logits_rows[i]} * vocab,
                sizeof(float) * static_cast<size_t>(vocab));
  }
  for (const int32_t row : argmax_rows) output.argmax_token_ids.push_back(argmax_host_.as<int32_t>()[row]);
  return output;
}

}  // namespace

namespace {

// The pool's shape for `model` (this rank's KV heads, with their replication under TP)
// and its size by exactly one of options' bytes, fraction of the device's free memory
// (measured now) or blocks.
absl::StatusOr<kv::KvLayoutOptions> PoolLayoutOptions(const LlamaModel& model, const CudaModelRunnerOptions& options) {
  const int sizings = (options.kv_cache_bytes > 0) + (options.kv_cache_memory_fraction > 0) + (options.num_blocks > 0);
  if (sizings != 1)
    return absl::InvalidArgumentError("size the CUDA KV pool by exactly one of bytes, memory fraction or blocks");
  if (options.kv_cache_dtype != DType::kF32 && options.kv_cache_dtype != DType::kBF16 &&
      options.kv_cache_dtype != DType::kFP8E4M3)
    return absl::InvalidArgumentError("the CUDA KV cache holds f32, bf16 or fp8");
  const model::ModelConfig& c = model.config();
  kv::KvLayoutOptions layout{
      .num_layers = static_cast<int32_t>(c.num_hidden_layers),
      .num_kv_heads = static_cast<int32_t>(model.shard().num_kv_heads),
      .kv_head_replication = model.shard().kv_head_replication,
      .head_dim = static_cast<int32_t>(c.head_dim),
      .block_size_tokens = options.block_size_tokens,
      .dtype = options.kv_cache_dtype,
      .budget_bytes = options.kv_cache_bytes,
      .num_blocks = options.num_blocks,
  };
  if (options.kv_cache_memory_fraction > 0) {
    if (options.kv_cache_memory_fraction >= 1)
      return absl::InvalidArgumentError("the KV memory fraction must be in (0, 1)");
    size_t free_bytes = 0, total_bytes = 0;
    KVMESH_RETURN_IF_CUDA_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    layout.budget_bytes = static_cast<int64_t>(options.kv_cache_memory_fraction * static_cast<double>(free_bytes));
  }
  return layout;
}

// The CUDA backend is the one whose ops take device memory and run on a CUDA stream.
absl::StatusOr<int> CudaDeviceOf(const LlamaModel& model) {
  const auto stream = static_cast<cudaStream_t>(model.backend().queue());
  if (model.backend().uses_host_memory() || stream == nullptr)
    return absl::FailedPreconditionError(absl::StrCat("the CUDA runner needs a model loaded on the CUDA backend, not ",
                                                      std::string(model.backend().name())));
  int device = 0;
  KVMESH_RETURN_IF_CUDA_ERROR(cudaStreamGetDevice(stream, &device), "finding the CUDA backend's GPU");
  return device;
}

}  // namespace

absl::StatusOr<int32_t> CudaKvPoolBlocks(const LlamaModel& model, const CudaModelRunnerOptions& options) {
  KVMESH_ASSIGN_OR_RETURN(const int device, CudaDeviceOf(model));
  KVMESH_RETURN_IF_CUDA_ERROR(cudaSetDevice(device), "selecting the model's GPU");
  KVMESH_ASSIGN_OR_RETURN(const kv::KvLayoutOptions layout, PoolLayoutOptions(model, options));
  if (layout.num_blocks > 0) return layout.num_blocks;
  return kv::NumBlocksForBudget(layout, layout.budget_bytes);
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaModelRunner(LlamaModel& model,
                                                                   const CudaModelRunnerOptions& options,
                                                                   comm::Communicator* comm) {
  KVMESH_ASSIGN_OR_RETURN(const int device, CudaDeviceOf(model));
  KVMESH_RETURN_IF_CUDA_ERROR(cudaSetDevice(device), "selecting the model's GPU");
  const model::TensorParallelShard& shard = model.shard();
  const int world = comm != nullptr ? comm->world_size() : 1;
  if (world != shard.size || (comm != nullptr && comm->rank() != shard.rank))
    return absl::InvalidArgumentError(absl::StrCat("model shard is rank ", shard.rank, " of ", shard.size,
                                                   " but the communicator's group has ", world, " ranks"));
  // NOTE: on their own stream the collectives would race the ops that write their
  // buffers, and a graph capture would miss them.
  if (comm != nullptr && comm->queue() != model.backend().queue())
    return absl::FailedPreconditionError(
        "the CUDA runner's communicator must queue its collectives on the backend's stream "
        "(NcclCommunicatorOptions::queue = Backend::queue())");
  const model::ModelConfig& c = model.config();
  // NOTE: the paged-attention kernels are instantiated for these head sizes only; any
  // other would fail at its first launch (cudaErrorInvalidValue) instead of here.
  if (c.head_dim != 64 && c.head_dim != 128)
    return absl::InvalidArgumentError(absl::StrCat("--device cuda: the CUDA paged-attention kernels take head_dim 64 or 128; "
                                                   "this model's is ",
                                                   c.head_dim, " (serve it with --device cpu)"));
  if (options.max_num_tokens < 1 || options.max_num_seqs < 1 || options.max_model_len < 1 ||
      options.max_num_seqs > options.max_num_tokens)
    return absl::InvalidArgumentError(
        "the CUDA runner needs max_num_tokens >= max_num_seqs >= 1 and max_model_len >= 1");
  KVMESH_ASSIGN_OR_RETURN(const kv::KvLayoutOptions layout, PoolLayoutOptions(model, options));
  KVMESH_ASSIGN_OR_RETURN(kv::KvLayout kv_layout, kv::KvLayout::Create(layout));
  auto runner = std::make_unique<CudaModelRunner>(model, device, kv_layout, options, comm);
  KVMESH_RETURN_IF_ERROR(runner->Init());
  return runner;
}

absl::StatusOr<CudaHostTierMemory> MakeCudaHostTierMemory(int device, bool managed) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", device, " for the host KV tier"));
  }
  CudaHostTierMemory memory;
  if (!managed) {
    memory.allocate = [device](int64_t bytes) -> std::byte* {
      void* p = nullptr;
      if (cudaSetDevice(device) != cudaSuccess ||
          cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
      }
      return static_cast<std::byte*>(p);
    };
    memory.deallocate = [](std::byte* p) { cudaFreeHost(p); };
    return memory;
  }
  memory.allocate = [device](int64_t bytes) -> std::byte* {
    void* p = nullptr;
    const size_t n = static_cast<size_t>(bytes);
    if (cudaSetDevice(device) != cudaSuccess || cudaMallocManaged(&p, n, cudaMemAttachGlobal) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    // Host-resident, read and written by the GPU in place (no migration on each swap);
    // advice is a hint, so a device without it still works, only slower.
    cudaMemLocation host{.type = cudaMemLocationTypeHost, .id = 0};
    cudaMemLocation gpu{.type = cudaMemLocationTypeDevice, .id = device};
    (void)cudaMemAdvise(p, n, cudaMemAdviseSetPreferredLocation, host);
    (void)cudaMemAdvise(p, n, cudaMemAdviseSetAccessedBy, gpu);
    (void)cudaMemPrefetchAsync(p, n, host, 0, nullptr);
    (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();
    return static_cast<std::byte*>(p);
  };
  memory.deallocate = [](std::byte* p) { cudaFree(p); };
  return memory;
}

}  // namespace kvmesh::engine
