// ForwardPass: the Llama decoder over one step's flattened tokens (prefill chunks and
// decode steps of many sequences at once, over a paged KV pool), written once over the
// backend's ops (backend/ops.h). Every paged runner runs it: PagedModelRunner on the CPU
// backends (each tensor-parallel rank included) and the CUDA runner, which captures it
// into its decode graphs. LlamaModel::Forward, the dense single-sequence path, stays
// as the test oracle it is checked against.
//
// Memory: every view and span a step names, and the weights in ForwardWeights, are in
// the backend's memory (host for the CPU backends, the device for cuda); so are the
// activations the pass allocates through Backend::Allocate. Counts are host values.
//
// Tensor parallelism: with a communicator the model is this rank's shard
// (LlamaModel::shard()). The pass then all-reduces the row-parallel outputs (o_proj,
// down_proj) and the vocab-parallel embedding, and all-gathers the vocab-parallel
// logits; every rank must Run the same step. The collectives take backend memory.
//
// Errors: Run returns the communicator's errors; the backend's run-time failures stay
// with the backend (ops.h, clause 2) for the caller's one TakeError() per step. A rank
// never returns early between collectives on a backend error, so its peers never wait
// on a collective it skipped.
//
// Thread-safety: not thread-safe; owned by one runner on its engine or rank thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "backend/ops.h"
#include "core/tensor_view.h"
#include "engine/llama_model.h"

namespace kvmesh::comm {
class Communicator;
}  // namespace kvmesh::comm

namespace kvmesh::engine {

// The weights the pass reads besides the model's packed linears and LM head, in the
// backend's memory. A CPU runner uses the model's own (FromModel); the CUDA runner its
// device copies.
struct ForwardWeights {
  TensorView embed_tokens;              // [V, E]: this shard's rows (ids vocab_begin .. + V - 1)
  std::vector<TensorView> input_norms;  // [E] per layer
  std::vector<TensorView> post_norms;   // [E] per layer
  TensorView final_norm;                // [E]
  std::span<const float> rope_inv_freq;  // [D / 2]

  // Views of `model`'s host weights.
  static ForwardWeights FromModel(const LlamaModel& model);
};

// One step's inputs and outputs, in the backend's memory (engine/step_metadata.h builds
// them on the host; a device runner uploads them).
struct ForwardStep {
  int64_t num_tokens = 0;               // T: rows of token_ids, positions and slots
  std::span<const int32_t> token_ids;   // [T]
  std::span<const int32_t> positions;   // [T]
  std::span<const int64_t> slots;       // [T]: each token's KV slot (negative: padding, cuda only)
  backend::PagedAttentionBatch attention;
  std::span<const int32_t> logit_rows;  // [R]: the rows that go through the final norm and LM head
  TensorView logits;                    // [R, vocab] f32: where their logits go
  std::span<int32_t> argmax;            // empty, or [R]: each row's greedy token too
  // Layer l's KV pool ([num_blocks, 2, Hkv, B, D]) and, when set, a hook run after layer
  // l's keys and values are written into it (queued, on a device backend).
  std::function<TensorView(int32_t layer)> kv_cache;
  std::function<void(int32_t layer)> after_kv_write;
};

class ForwardPass {
 public:
  // `model` (and its backend) and `comm` must outlive the pass. comm: nullptr for one rank.
  ForwardPass(const LlamaModel& model, ForwardWeights weights, comm::Communicator* comm);

  // Sizes the activations for steps of up to `max_tokens` rows of which up to
  // `max_logit_rows` go through the LM head: allocates only when they grow, so a runner
  // that reserves its largest step up front never allocates during a step (or a graph
  // capture). ResourceExhausted from the backend's Allocate.
  absl::Status Reserve(int64_t max_tokens, int64_t max_logit_rows);

  // Runs (on a device backend: queues) the pass over `step`, which Reserve must cover.
  absl::Status Run(const ForwardStep& step);

 private:
  // A [rows, cols] f32 view over the front of `buffer`.
  static TensorView Rows(const backend::Backend::Buffer& buffer, int64_t rows, int64_t cols);
  absl::Status Embed(const ForwardStep& step, const TensorView& residual);
  absl::Status LmHead(const ForwardStep& step, const TensorView& head_in);

  const LlamaModel& model_;
  backend::Backend& be_;
  const ForwardWeights weights_;
  comm::Communicator* const comm_;
  int64_t max_tokens_ = 0, max_logit_rows_ = 0;
  // Activations: [max_tokens, width] f32 each, except head_in_ ([max_logit_rows, E]) and,
  // under tensor parallelism, this rank's logits and every rank's ([ranks, rows, V_shard]).
  std::unique_ptr<backend::Backend::Buffer> residual_, hidden_, qkv_, q_, k_, v_, attn_, proj_, gate_up_, act_,
      head_in_, local_logits_, gathered_logits_;
};

}  // namespace kvmesh::engine
