// The scheduler's state of one request (RequestState) and of each of its parallel
// samples (Sequence). vLLM v1 keeps the same facts on its Request object.
//
// A Sequence is what the scheduler batches and what owns blocks in the KV manager (one
// kv::RequestId each). Its work is uniform: the KV of token_ids[0, num_computed_tokens)
// is computed, the rest is pending. A fresh prompt, a decode (one pending token) and a
// recompute after preemption (prompt + generated tokens pending) are all "compute the
// pending tokens, then sample once all are computed".
//
// Parallel sampling: a request with n > 1 has ONE sequence (sample 0) until its prompt
// is computed; then it forks into n (KvCacheManager::Fork shares every block) and each
// sample draws its own first token from the same logits.
//
// Thread-safety: not thread-safe; owned by the Scheduler.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "engine/sampler.h"
#include "kv/kv_types.h"

namespace kvmesh::engine {

struct RequestState;

// kReceiving and kPrefilled are the two halves of prefill/decode disaggregation: the
// sequence holds KV blocks but is in neither queue and is never scheduled or preempted.
//   kReceiving: decode side; its prompt's blocks are allocated and a remote prefill
//     worker is writing them (Engine::ReserveForRemotePrefill); commit makes it kRunning.
//   kPrefilled: prefill side; a prefill-only request whose prompt is computed and first
//     token sampled; its blocks are pinned until released (Engine::ReleasePrefill).
enum class SequenceStatus : uint8_t { kWaiting, kRunning, kReceiving, kPrefilled, kFinished };

struct Sequence {
  RequestState* request = nullptr;  // the owner; outlives this
  kv::RequestId kv_id;
  int32_t sample_index = 0;
  int64_t creation_order = 0;  // scheduler-wide counter: the final tie-break
  SequenceStatus status = SequenceStatus::kWaiting;
  // Prompt + generated tokens.
  std::vector<int32_t> token_ids;
  // Mirrors the KV manager's count while the sequence holds blocks; 0 while waiting.
  int32_t num_computed_tokens = 0;
  // Positions below this are prefill work: the prompt, or prompt + outputs after a
  // preemption. Later positions are decode tokens. For the prefill-token statistics.
  int32_t num_prefill_tokens = 0;
  // Created at the first sample (lazily: 2 x vocab floats of scratch each).
  std::optional<SequenceSampler> sampler;
  CompletionFinishReason finish_reason = CompletionFinishReason::kNone;
  std::optional<int32_t> stop_token_id;
  int32_t num_preemptions = 0;
  // Hashes of the full blocks of token_ids as of admission (empty without prefix
  // caching): while num_computed_tokens has not reached one of them, a waiting
  // request with the same block defers instead of computing it twice.
  std::vector<kv::BlockHash> admitted_block_hashes;
  // Waiting for these blocks of its prefix to be loaded from below the host tier (a
  // kv::KvConnector: disk, kv-store; empty: not waiting). disk_load_from: the prefix
  // block the last load began at (-1: none since admission); a new load must begin
  // further on, so a sequence cannot wait for the same blocks forever, yet a load cut
  // short (host tier full) continues where the first one ended instead of recomputing
  // the rest. (engine/kv_load_gate.h keeps these.)
  std::vector<kv::BlockHash> loading_block_hashes;
  int32_t disk_load_from = -1;
  // Waiting for a connector's lookup (kv::KvConnectorMatch::pending): the connectors'
  // answer count before the lookup that said so, and when it was made; the prefix is
  // looked up again once an answer came (or a while passed), not every step.
  std::optional<uint64_t> lookup_answers_before;
  std::chrono::steady_clock::time_point lookup_checked_at;
  // Not yet reported in a RequestOutput.
  std::vector<int32_t> pending_token_ids;
  std::vector<SampleResult> pending_logprobs;
  bool finish_pending = false;
  // Entries of its block table the runner keeps (SchedulerOptions::runner_keeps_block_tables):
  // > 0 from its first chunk until its KV is freed or it is parked prefilled (then listed
  // in the next batch's released_seq_ids).
  int32_t runner_table_blocks = 0;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_output_tokens() const;
  bool finished() const { return status == SequenceStatus::kFinished; }
};

struct RequestState {
  RequestState(const EngineRequest& request, int64_t arrival_order);

  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  SamplingParams sampling_params;
  int32_t n = 1;
  int32_t priority = 0;
  int64_t arrival_order = 0;
  std::vector<int32_t> eos_token_ids;
  std::string cache_salt;  // EngineRequest::cache_salt: every block hash lookup and store uses it
  StopChecker stop_checker;
  // EngineRequest::resume_output_token_ids: replayed into the sampler when it is made.
  std::vector<int32_t> resume_output_token_ids;
  // Sample 0 first; the others appear at the fork.
  std::vector<std::unique_ptr<Sequence>> seqs;
  // The n samples exist (always true for n == 1 once sampling starts).
  bool forked = false;
  // Prefix-cache tokens at the first scheduling; -1 before it.
  int32_t num_cached_prompt_tokens = -1;
  // Milestones reported in every RequestOutput; arrival is set at construction.
  RequestTimes times;
  // Prefill-only (disaggregated prefill side): stop after the first token and pin the
  // prompt's blocks (sequence kPrefilled) instead of decoding. n is forced to 1.
  bool prefill_only = false;
  int32_t num_skipped_blocks = 0;  // reported in PrefillResult
  // Prompt logprobs computed so far (sampling_params.prompt_logprobs >= 0): entry i is
  // prompt token i + 1's; complete at num_prompt_tokens() - 1 entries.
  std::vector<SampleResult> prompt_logprobs;
  bool prompt_logprobs_reported = false;
  bool wants_prompt_logprobs() const {
    return sampling_params.prompt_logprobs >= 0 && !prompt_logprobs_reported &&
           static_cast<int32_t>(prompt_logprobs.size()) < num_prompt_tokens() - 1;
  }
  // The prefill-only result not yet reported in a RequestOutput.
  std::optional<PrefillResult> pending_prefill_result;

  int32_t num_prompt_tokens() const { return static_cast<int32_t>(prompt_token_ids.size()); }
  // Sequence slots (max_num_seqs) the request takes once running: n before the fork.
  int32_t num_seq_slots_if_unforked() const { return forked ? 1 : n; }
  bool AllFinished() const;
  // The SamplingParams of sample `index`: seed + index when seeded.
  SamplingParams SampleParams(int32_t index) const;
};

}  // namespace kvmesh::engine
