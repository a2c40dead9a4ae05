#include "engine/paged_model_runner.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "core/status_macros.h"

namespace kvmesh::engine {

absl::StatusOr<std::unique_ptr<PagedModelRunner>> PagedModelRunner::Create(LlamaModel& model,
                                                                          const PagedModelRunnerOptions& options,
                                                                          comm::Communicator* comm) {
  if (!model.backend().uses_host_memory())
    return absl::FailedPreconditionError(absl::StrCat("PagedModelRunner computes in host memory; a model on ",
                                                      std::string(model.backend().name()),
                                                      " needs the CUDA runner (engine/cuda_model_runner.h)"));
  const auto& c = model.config();
  const model::TensorParallelShard& shard = model.shard();
  const int world = comm == nullptr ? 1 : comm->world_size();
  if (world != shard.size || (comm != nullptr && comm->rank() != shard.rank))
    return absl::InvalidArgumentError(absl::StrCat("model shard is rank ", shard.rank, " of ", shard.size,
                                                   ", communicator is rank ", comm ? comm->rank() : 0, " of ", world));
  kv::KvLayoutOptions layout{
      .num_layers = static_cast<int32_t>(c.num_hidden_layers),
      .num_kv_heads = static_cast<int32_t>(shard.num_kv_heads),
      .kv_head_replication = shard.kv_head_replication,
      .head_dim = static_cast<int32_t>(c.head_dim),
      .block_size_tokens = options.block_size_tokens,
      .dtype = options.kv_cache_dtype,
      .budget_bytes = options.kv_cache_bytes,
      .num_blocks = options.num_blocks,
  };
  KVMESH_ASSIGN_OR_RETURN(auto storage, kv::KvStorage::Create(layout));
  return std::unique_ptr<PagedModelRunner>(new PagedModelRunner(model, std::move(storage), comm));
}

absl::Status PagedModelRunner::Prepare(const ModelBatch& batch) {
  KVMESH_RETURN_IF_ERROR(
      BuildStepMetadata(batch, tables_, block_size_tokens(), vocab_size(), /*with_block_tables=*/true, &meta_));
  if (batch.block_copies.empty()) return absl::OkStatus();
  copy_pairs_.clear();
  for (const KvBlockCopy& copy : batch.block_copies) {
    if (copy.src < 0 || copy.src >= num_blocks() || copy.dst < 0 || copy.dst >= num_blocks())
      return absl::InvalidArgumentError(
          absl::StrCat("a block copy names a block outside the pool: ", copy.src, " -> ", copy.dst));
    copy_pairs_.push_back(copy.src);
    copy_pairs_.push_back(copy.dst);
  }
  const kv::KvLayout& layout = storage_->layout();
  model_.backend().CopyBlocks({.data = storage_->data(),
                               .num_layers = layout.num_layers(),
                               .layer_bytes = layout.LayerBytes(),
                               .block_bytes = layout.BlockBytes()},
                              copy_pairs_);
  return absl::OkStatus();
}

int64_t PagedModelRunner::kv_swap_bytes_per_block() const {
  return storage_->SwapBytesPerBlock() * (comm_ != nullptr ? comm_->world_size() : 1);
}

KvSlotShape PagedModelRunner::kv_slot_shape() const {
  const kv::KvLayout& layout = storage_->layout();
  return {.num_layers = layout.num_layers() * (comm_ != nullptr ? comm_->world_size() : 1),
          .block_bytes = layout.BlockBytes(),
          .dtype = static_cast<int32_t>(layout.dtype())};
}

absl::Status PagedModelRunner::RunSwaps(const ModelBatch& batch, ModelOutput& output) {
  // Under TP the host slot holds every rank's heads; this rank's share is at rank * its size.
  const int64_t offset = comm_ != nullptr ? comm_->rank() * storage_->SwapBytesPerBlock() : 0;
  auto copies = [offset](const std::vector<KvBlockSwap>& swaps) {
    std::vector<kv::KvHostCopy> out;
    out.reserve(swaps.size());
    for (const KvBlockSwap& s : swaps) out.push_back({.block = kv::BlockId{s.block}, .host = s.host + offset});
    return out;
  };
  // The backend's team, idle between steps' ops (each TP rank has its own).
  const int threads = model_.backend().num_host_threads();
  auto start = std::chrono::steady_clock::now();
  if (!batch.swap_out.empty()) {
    // NOTE: only a whole slot's writer can hash it: a TP rank copies its share alone.
    if (comm_ == nullptr) output.swap_out_checksums.resize(batch.swap_out.size());
    KVMESH_RETURN_IF_ERROR(storage_->SwapOut(copies(batch.swap_out), output.swap_out_checksums, threads));
  }
  auto mid = std::chrono::steady_clock::now();
  if (!batch.swap_in.empty()) {
    const bool verify = verifies_swap_ins() && batch.swap_in_checksums.size() == batch.swap_in.size();
    if (verify) output.swap_in_checksums.resize(batch.swap_in.size());
    KVMESH_RETURN_IF_ERROR(storage_->SwapIn(copies(batch.swap_in), output.swap_in_checksums, threads));
    output.swap_in_mismatch = verify && output.swap_in_checksums != batch.swap_in_checksums;
  }
  auto end = std::chrono::steady_clock::now();
  output.swap_out_seconds = std::chrono::duration<double>(mid - start).count();
  output.swap_in_seconds = std::chrono::duration<double>(end - mid).count();
  return absl::OkStatus();
}

absl::StatusOr<ModelOutput> PagedModelRunner::Execute(const ModelBatch& batch) {
  ModelOutput output;
  // First: the scheduler counts on every batch's table deltas and releases being applied.
  KVMESH_RETURN_IF_ERROR(tables_.Apply(batch, /*updates=*/nullptr));
  if (!batch.swap_out.empty() || !batch.swap_in.empty()) KVMESH_RETURN_IF_ERROR(RunSwaps(batch, output));
  if (batch.chunks.empty() || output.swap_in_mismatch) return output;
  KVMESH_RETURN_IF_ERROR(Prepare(batch));
  const int64_t t = static_cast<int64_t>(meta_.token_ids.size());
  const int64_t r = static_cast<int64_t>(meta_.logit_rows.size());
  KVMESH_RETURN_IF_ERROR(forward_.Reserve(t, r));
  output.logits.resize(r * model_.config().vocab_size);
  const ForwardStep step{
      .num_tokens = t,
      .token_ids = meta_.token_ids,
      .positions = meta_.positions,
      .slots = meta_.slots,
      .attention = {.query_start = meta_.query_start,
                    .context_lens = meta_.context_lens,
                    .block_tables = meta_.block_tables,
                    .max_blocks_per_seq = meta_.max_blocks_per_seq,
                    .max_query_len = meta_.max_query_len,
                    .max_context_len = meta_.max_context_len},
      .logit_rows = meta_.logit_rows,
      .logits = TensorView::Contiguous(output.logits.data(), DType::kF32, {r, model_.config().vocab_size}),
      .kv_cache = [this](int32_t layer) { return storage_->LayerView(layer); },
      .after_kv_write = batch.on_layer_kv_written,
  };
  KVMESH_RETURN_IF_ERROR(forward_.Run(step));
  // The backend's run-time failures (ops.h, error contract clause 2), before any result is read.
  KVMESH_RETURN_IF_ERROR(model_.backend().TakeError());
  return output;
}

}  // namespace kvmesh::engine
