#include "engine/paged_model_runner.h"

#include <chrono>

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "core/status_macros.h"

namespace kvmesh::engine {
namespace {

TensorView F32(std::vector<float>& buffer, int64_t rows, int64_t cols) {
  return TensorView::Contiguous(buffer.data(), DType::kF32, {rows, cols});
}

}  // namespace

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
  for (const KvBlockCopy& copy : batch.block_copies) {
    KVMESH_RETURN_IF_ERROR(storage_->CopyBlock(kv::BlockId{copy.src}, kv::BlockId{copy.dst}));
  }
  return absl::OkStatus();
}

void PagedModelRunner::EnsureScratch(int64_t t) {
  if (t <= scratch_tokens_) return;
  const auto& c = model_.config();
  const model::TensorParallelShard& shard = model_.shard();
  const int64_t e = c.hidden_size, d = c.head_dim, h = shard.num_heads, hkv = shard.num_kv_heads;
  residual_.resize(t * e);
  hidden_.resize(t * e);
  qkv_.resize(t * (h + 2 * hkv) * d);
  q_.resize(t * h * d);
  k_.resize(t * hkv * d);
  v_.resize(t * hkv * d);
  attn_.resize(t * h * d);
  proj_.resize(t * e);
  gate_up_.resize(t * 2 * shard.intermediate_size);
  act_.resize(t * shard.intermediate_size);
  head_in_.resize(t * e);
  scratch_tokens_ = t;
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
  const auto& c = model_.config();
  // This rank's heads and MLP slice (all of them without tensor parallelism).
  const model::TensorParallelShard& shard = model_.shard();
  const int64_t t = static_cast<int64_t>(meta_.token_ids.size());
  const int64_t e = c.hidden_size, d = c.head_dim, h = shard.num_heads, hkv = shard.num_kv_heads;
  const int64_t inter = shard.intermediate_size, qkv_width = (h + 2 * hkv) * d;
  const float eps = c.rms_norm_eps;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  EnsureScratch(t);
  backend::Backend& be = model_.backend();
  const model::ModelWeights& weights = model_.weights();
  const backend::PagedAttentionBatch attention_batch{
      .query_start = meta_.query_start, .context_lens = meta_.context_lens, .block_tables = meta_.block_tables,
      .max_blocks_per_seq = meta_.max_blocks_per_seq, .max_query_len = meta_.max_query_len,
      .max_context_len = meta_.max_context_len};

  TensorView residual = F32(residual_, t, e), hidden = F32(hidden_, t, e), proj = F32(proj_, t, e);
  TensorView q = TensorView::Contiguous(q_.data(), DType::kF32, {t, h, d});
  TensorView k = TensorView::Contiguous(k_.data(), DType::kF32, {t, hkv, d});
  TensorView v = TensorView::Contiguous(v_.data(), DType::kF32, {t, hkv, d});
  TensorView attn = TensorView::Contiguous(attn_.data(), DType::kF32, {t, h, d});
  if (comm_ != nullptr) {
    KVMESH_RETURN_IF_ERROR(ShardedEmbedding(residual));
  } else {
    be.Embedding(meta_.token_ids, weights.embed_tokens, residual);
  }
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const model::LayerWeights& w = weights.layers[l];
    const LlamaModel::PackedLayer& packed = model_.layer(l);
    if (l == 0) {
      be.RmsNorm(residual, w.input_layernorm, eps, hidden);
    } else {
      be.AddRmsNorm(residual, proj, w.input_layernorm, eps, hidden);
    }
    be.Linear(hidden, *packed.qkv, F32(qkv_, t, qkv_width));
    for (int64_t i = 0; i < t; ++i) {
      const float* row = qkv_.data() + i * qkv_width;
      std::memcpy(q_.data() + i * h * d, row, sizeof(float) * h * d);
      std::memcpy(k_.data() + i * hkv * d, row + h * d, sizeof(float) * hkv * d);
      std::memcpy(v_.data() + i * hkv * d, row + (h + hkv) * d, sizeof(float) * hkv * d);
    }
    be.ApplyRope(q, k, meta_.positions, model_.rope_inv_freq());
    const TensorView kv_cache = storage_->LayerView(static_cast<int32_t>(l));
    be.WriteKvCache(k, v, meta_.slots, kv_cache);
    if (batch.on_layer_kv_written) batch.on_layer_kv_written(static_cast<int32_t>(l));
    be.PagedAttention(q, kv_cache, attention_batch, scale, attn);
    be.Linear(F32(attn_, t, h * d), *packed.o, proj);
    // Row-parallel: each rank holds a partial sum over its heads.
    if (comm_ != nullptr) KVMESH_RETURN_IF_ERROR(comm_->AllReduceSum(proj_.data(), t * e, DType::kF32));
    be.AddRmsNorm(residual, proj, w.post_attention_layernorm, eps, hidden);
    be.Linear(hidden, *packed.gate_up, F32(gate_up_, t, 2 * inter));
    be.SiluAndMul(F32(gate_up_, t, 2 * inter), F32(act_, t, inter));
    be.Linear(F32(act_, t, inter), *packed.down, proj);
    if (comm_ != nullptr) KVMESH_RETURN_IF_ERROR(comm_->AllReduceSum(proj_.data(), t * e, DType::kF32));
  }
  // The backend's run-time failures (ops.h, error contract clause 2), before any result is read.
  KVMESH_RETURN_IF_ERROR(be.TakeError());
  if (meta_.logit_rows.empty()) return output;
  // The final norm and LM head run only on the rows whose logits are wanted.
  const int64_t r = static_cast<int64_t>(meta_.logit_rows.size());
  for (int64_t i = 0; i < r; ++i) {
    const int64_t row = meta_.logit_rows[i];
    for (int64_t j = 0; j < e; ++j) head_in_[i * e + j] = residual_[row * e + j] + proj_[row * e + j];
  }
  TensorView head_in = F32(head_in_, r, e);
  be.RmsNorm(head_in, weights.norm, eps, head_in);
  if (comm_ != nullptr) {
    KVMESH_RETURN_IF_ERROR(ShardedLmHead(head_in, r, output.logits));
    return output;
  }
  output.logits.resize(r * c.vocab_size);
  be.Linear(head_in, model_.lm_head(), TensorView::Contiguous(output.logits.data(), DType::kF32, {r, c.vocab_size}));
  KVMESH_RETURN_IF_ERROR(be.TakeError());
  return output;
}

absl::Status PagedModelRunner::ShardedEmbedding(const TensorView& out) {
  const model::TensorParallelShard& shard = model_.shard();
  const int64_t t = static_cast<int64_t>(meta_.token_ids.size());
  const int64_t e = model_.config().hidden_size;
  local_token_ids_.resize(t);
  for (int64_t i = 0; i < t; ++i) {
    const int64_t local = meta_.token_ids[i] - shard.vocab_begin;
    // Another rank's token: look up any row, zeroed below.
    local_token_ids_[i] = local >= 0 && local < shard.vocab_size ? static_cast<int32_t>(local) : 0;
  }
  model_.backend().Embedding(local_token_ids_, model_.weights().embed_tokens, out);
  float* rows = out.data_as<float>();
  for (int64_t i = 0; i < t; ++i) {
    const int64_t local = meta_.token_ids[i] - shard.vocab_begin;
    if (local < 0 || local >= shard.vocab_size) std::memset(rows + i * e, 0, sizeof(float) * e);
  }
  // Exactly one rank contributes each row, so the sum is exact.
  return comm_->AllReduceSum(rows, t * e, DType::kF32);
}

absl::Status PagedModelRunner::ShardedLmHead(const TensorView& head_in, int64_t r, std::vector<float>& out) {
  const model::TensorParallelShard& shard = model_.shard();
  const int64_t vl = shard.vocab_size, n = shard.size, vocab = model_.config().vocab_size;
  local_logits_.resize(r * vl);
  gathered_logits_.resize(n * r * vl);
  model_.backend().Linear(head_in, model_.lm_head(), TensorView::Contiguous(local_logits_.data(), DType::kF32, {r, vl}));
  KVMESH_RETURN_IF_ERROR(model_.backend().TakeError());
  KVMESH_RETURN_IF_ERROR(comm_->AllGather(local_logits_.data(), gathered_logits_.data(), r * vl, DType::kF32));
  // gathered: [rank, row, vl] -> out: [row, rank * vl + j].
  out.resize(r * vocab);
  for (int64_t p = 0; p < n; ++p) {
    for (int64_t i = 0; i < r; ++i) {
      std::memcpy(out.data() + i * vocab + p * vl, gathered_logits_.data() + (p * r + i) * vl, sizeof(float) * vl);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::engine
