// HostMirroredRunner: a PagedModelRunner seen the way the engine sees a CUDA runner of a
// prefill or decode worker (CudaModelRunnerOptions::host_kv_mirror). The inner runner's
// pool stands in for device memory: the transfer paths reach only a separate host mirror,
// and blocks cross between the two only when the engine asks (CopyKvToHostMirror,
// CopyKvFromHostMirror, ModelBatch::layer_kv_read_blocks). The mirror starts as 0xFF
// bytes (NaN in f32 and bf16), so a block the engine forgets to copy out is read as
// garbage by the decode side, as on a GPU, and the tokens differ.
//
// Thread-safety: not thread-safe (as the runner it wraps).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/model_runner.h"
#include "engine/paged_model_runner.h"
#include "kv/kv_layout.h"

namespace kvmesh::engine::testing {

class HostMirroredRunner : public ModelRunner {
 public:
  explicit HostMirroredRunner(std::unique_ptr<PagedModelRunner> inner) : inner_(std::move(inner)) {
    const kv::KvLayout& layout = inner_->storage().layout();
    mirror_ = kv::KvStorage::Create({.num_layers = layout.num_layers(),
                                     .num_kv_heads = layout.num_kv_heads(),
                                     .head_dim = layout.head_dim(),
                                     .block_size_tokens = layout.block_size_tokens(),
                                     .dtype = layout.dtype(),
                                     .num_blocks = layout.num_blocks()})
                  .value();
    std::memset(mirror_->data(), 0xFF, static_cast<size_t>(mirror_->size_bytes()));
  }

  int32_t vocab_size() const override { return inner_->vocab_size(); }
  int32_t block_size_tokens() const override { return inner_->block_size_tokens(); }
  int32_t num_blocks() const override { return inner_->num_blocks(); }
  bool returns_argmax() const override { return inner_->returns_argmax(); }
  bool all_position_logits() const override { return inner_->all_position_logits(); }
  bool keeps_block_tables() const override { return inner_->keeps_block_tables(); }
  bool verifies_swap_ins() const override { return inner_->verifies_swap_ins(); }
  int64_t kv_swap_bytes_per_block() const override { return inner_->kv_swap_bytes_per_block(); }
  KvSlotShape kv_slot_shape() const override { return inner_->kv_slot_shape(); }
  std::optional<kv::KvLayout> kv_pool_layout() override { return inner_->storage().layout(); }
  std::vector<kv::KvStorage*> kv_rank_storages() override { return {mirror_.get()}; }

  absl::StatusOr<ModelOutput> Execute(const ModelBatch& batch) override {
    if (!batch.on_layer_kv_written) return inner_->Execute(batch);
    // As the CUDA runner does: each layer's listed blocks go to the mirror before its hook.
    ModelBatch staged = batch;
    staged.on_layer_kv_written = [this, &batch](int32_t layer) {
      for (const int32_t block : batch.layer_kv_read_blocks) {
        Copy(layer, block, /*to_mirror=*/true);
        ++layer_blocks_mirrored_;
      }
      batch.on_layer_kv_written(layer);
    };
    return inner_->Execute(staged);
  }

  absl::Status CopyKvToHostMirror(std::span<const int32_t> blocks) override { return CopyAll(blocks, true); }
  absl::Status CopyKvFromHostMirror(std::span<const int32_t> blocks) override { return CopyAll(blocks, false); }

  // (layer, block) pairs copied to the mirror during streamed steps, and whole blocks
  // (every layer) copied by CopyKvToHostMirror and CopyKvFromHostMirror.
  int64_t layer_blocks_mirrored() const { return layer_blocks_mirrored_; }
  int64_t blocks_to_mirror() const { return blocks_to_mirror_; }
  int64_t blocks_from_mirror() const { return blocks_from_mirror_; }

 private:
  void Copy(int32_t layer, int32_t block, bool to_mirror) {
    const std::span<std::byte> device = inner_->storage().BlockData(layer, kv::BlockId{block});
    const std::span<std::byte> host = mirror_->BlockData(layer, kv::BlockId{block});
    if (to_mirror) {
      std::memcpy(host.data(), device.data(), device.size());
    } else {
      std::memcpy(device.data(), host.data(), host.size());
    }
  }
  absl::Status CopyAll(std::span<const int32_t> blocks, bool to_mirror) {
    for (const int32_t block : blocks) {
      if (block < 0 || block >= num_blocks()) return absl::InvalidArgumentError(absl::StrCat("block ", block));
    }
    for (const int32_t block : blocks) {
      for (int32_t layer = 0; layer < mirror_->layout().num_layers(); ++layer) Copy(layer, block, to_mirror);
    }
    (to_mirror ? blocks_to_mirror_ : blocks_from_mirror_) += static_cast<int64_t>(blocks.size());
    return absl::OkStatus();
  }

  std::unique_ptr<PagedModelRunner> inner_;
  std::unique_ptr<kv::KvStorage> mirror_;
  int64_t layer_blocks_mirrored_ = 0;
  int64_t blocks_to_mirror_ = 0;
  int64_t blocks_from_mirror_ = 0;
};

}  // namespace kvmesh::engine::testing
