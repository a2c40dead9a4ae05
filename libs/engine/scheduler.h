// Scheduler: the continuous-batching iteration scheduler (vLLM v1's Scheduler over its
// KVCacheManager). It owns the waiting and running queues and every request's sequences,
// decides each step which tokens of which sequences run, allocates their KV slots, and
// after the model ran turns the logits into sampled tokens and outputs.
//
// One step (Schedule):
//   1. Running sequences first, in queue order: each gets its pending tokens (1 for a
//      decode; the rest of an unfinished prefill, capped by long_prefill_token_threshold
//      and by the remaining token budget). When the KV pool cannot supply a sequence's
//      blocks, the scheduler preempts the lowest-priority running sequence (FCFS: the last
//      admitted; kPriority: the largest (priority, arrival)) and retries, until the
//      allocation succeeds or the sequence preempted itself.
//   2. Only if nothing was preempted: waiting sequences, in queue order, while the token
//      budget and max_num_seqs allow. A sequence's cached prefix (FindCachedPrefix) is
//      taken as computed and costs no budget; a prompt longer than the remaining budget
//      is chunked (enable_chunked_prefill) or waits. A waiting sequence never preempts.
// Preemption is by recompute: the victim's blocks are freed, its prompt + generated
// tokens become pending work again, and it returns to the FRONT of the waiting queue
// (kPriority: to its place by (priority, arrival)). Its outputs and sampler (RNG state,
// penalty counts) are kept, so the tokens it produces are exactly those it would have
// produced without preemption, none lost or repeated. Its prefix blocks usually stay
// cached, so the recompute is mostly prefix hits.
//
// After the runner: UpdateFromOutput marks the chunks computed (newly full blocks enter
// the prefix cache), forks n > 1 requests whose prompt just completed, samples one token
// per sample from its logits row, runs stop checks and frees finished sequences' blocks.
//
// Prefill/decode disaggregation parks sequences outside both queues (never scheduled,
// never preempted, blocks held):
//   decode side:  ReserveRemotePrefill -> kReceiving -> CommitRemotePrefill -> kRunning
//                                                    \-> FailRequest / Abort -> ended
//   prefill side: AddPrefillOnlyRequest -> waiting/running as usual -> first token
//                 sampled -> kPrefilled (PrefillResult output) -> ReleasePrefill /
//                 FailRequest / Abort -> ended
//
// Thread-safety: not thread-safe; owned by the engine loop together with the KV manager.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kv_load_gate.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/sequence.h"
#include "kv/kv_cache_manager.h"

namespace kvmesh::engine {

struct SchedulerOptions {
  enum class Policy : uint8_t {
    kFcfs,      // arrival order; preempt the last admitted
    kPriority,  // (priority, arrival) ascending; preempt the largest
  };
  // Tokens computed per step across all sequences (vLLM's max_num_batched_tokens).
  int32_t max_num_batched_tokens = 2048;
  // Sequences per step; a request with n samples takes n once forked.
  int32_t max_num_seqs = 64;
  // Split prompts longer than the remaining budget across steps. When off, a prompt runs
  // in one step, so max_num_batched_tokens must cover max_model_len (Engine checks).
  bool enable_chunked_prefill = true;
  // With chunked prefill: at most this many tokens of one prefill per step (0: no cap),
  // so that one long prompt cannot crowd out the others (vLLM's option of that name).
  int32_t long_prefill_token_threshold = 0;
  Policy policy = Policy::kFcfs;
  // The runner returns greedy tokens itself (ModelRunner::returns_argmax): chunks of
  // sequences that sample greedily with no logprobs, penalties or min_tokens masks are
  // scheduled argmax_only.
  bool argmax_on_runner = false;
  // The runner keeps block tables between steps (ModelRunner::keeps_block_tables): chunks
  // carry the sequence's KV id and only the entries the runner lacks or that may have
  // changed, and each batch lists the sequences whose tables ended since the last one.
  bool runner_keeps_block_tables = false;

  // InvalidArgument for a non-positive budget or seq cap, or a negative threshold.
  absl::Status Validate() const;
};

// One sequence's share of a step, parallel to SchedulerOutput::batch.chunks.
struct ScheduledChunk {
  kv::RequestId kv_id;
  int32_t start_position = 0;  // tokens computed before this step
  int32_t num_tokens = 0;
  bool compute_logits = false;  // the chunk reaches the last known token: sample after it
  bool argmax_only = false;     // with compute_logits: the runner returns the greedy token
  bool all_logits = false;      // one logits row per token: the prompt logprobs need them
  std::vector<KvBlockCopy> block_copies;  // copy-on-write this chunk's allocation asked for
};

struct SchedulerOutput {
  ModelBatch batch;
  std::vector<ScheduledChunk> chunks;
  int32_t num_batched_tokens = 0;
  int32_t num_logits_rows = 0;  // chunks with compute_logits and not argmax_only; all_logits: their tokens
  int32_t num_argmax_rows = 0;  // chunks with compute_logits and argmax_only
  int32_t num_preempted = 0;    // sequences preempted while scheduling this step
  // The lower-tier copies in batch.swap_out / swap_in, for KvCacheManager::FinishSwaps
  // once the step ran.
  kv::KvSwaps swaps;
  // Nothing to run: no chunk and no tier copy.
  bool empty() const { return chunks.empty() && swaps.empty(); }
};

struct SchedulerStats {
  int32_t num_requests = 0;      // unfinished
  int32_t num_running_seqs = 0;
  int32_t num_waiting_seqs = 0;
  int32_t num_receiving_seqs = 0;  // decode side: waiting for a remote prefill's KV
  int32_t num_prefilled_seqs = 0;  // prefill side: computed, blocks pinned until released
  int64_t num_preemptions = 0;
  // Admissions put off one step because a running sequence was computing the same
  // prefix block (in-batch prefix sharing).
  int64_t num_deferred_for_prefix = 0;
  // Admissions put off to load the prefix from below the host tier first (disk tier,
  // kv-store: kv::KvConnector).
  int64_t num_waiting_for_disk = 0;
  // Admissions put off a step for a connector's lookup still in flight.
  int64_t num_waiting_for_lookup = 0;
  // Blocks a load covered for a waiting sequence (kv::KvLoadStart::num_blocks)
  // that its lookup after the load no longer found in tier 0 or the host tier
  // (recomputed: the load was wasted).
  int64_t num_disk_blocks_lost = 0;
  // Steps a sequence's first load waited because the load holds had no room
  // (kv::KvTiers::StartLoads), counted once per sequence and step.
  int64_t num_disk_loads_deferred = 0;
  int64_t num_prefill_tokens = 0;  // computed prefill tokens (cache hits excluded, recomputes included)
  int64_t num_decode_tokens = 0;
  int64_t num_finished_requests = 0;  // every end: stop, length, abort, error
  int64_t num_aborted_requests = 0;
  int64_t num_failed_requests = 0;
  int32_t last_batch_num_seqs = 0;
  int32_t last_batch_num_tokens = 0;
};

// The decode side's allocation for a remote prefill (Scheduler::ReserveRemotePrefill).
struct RemotePrefillReservation {
  kv::RequestId kv_id;
  std::vector<kv::BlockId> block_ids;  // the whole prompt, in position order
  int32_t num_cached_tokens = 0;       // leading prompt tokens from the local prefix cache
};

// Appends the tier copies `swaps` to `batch` (ModelBatch::swap_out / swap_in).
void AppendSwaps(const kv::KvSwaps& swaps, ModelBatch* batch);

class Scheduler {
 public:
  // `kv` must outlive the scheduler and is used by nobody else meanwhile.
  // InvalidArgument for invalid options or a non-positive vocab_size.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const SchedulerOptions& options,
                                                           kv::KvCacheManager& kv, int32_t vocab_size);

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; nothing is allocated until it is scheduled. The request must have
  // passed ValidateEngineRequest (the scheduler does not re-check it); its on_output is
  // ignored (the Engine delivers outputs). AlreadyExists for an unfinished request of
  // the same id. A negative request.arrival_order takes the scheduler's own counter.
  absl::Status AddRequest(const EngineRequest& request);

  // Decides this step's batch and allocates its KV slots (see the file comment). Empty
  // when nothing can run. Internal if the KV manager breaks its contract; the state is
  // then not to be trusted.
  absl::StatusOr<SchedulerOutput> Schedule();

  // Applies a step's result: `logits` is ModelOutput::logits, [num_logits_rows,
  // vocab_size], and `argmax_token_ids` ModelOutput::argmax_token_ids, [num_argmax_rows].
  // Returns one RequestOutput per request that changed, in batch order. A sample whose
  // logits cannot be sampled (or whose argmax is -1) fails its request (kError output,
  // blocks freed). InvalidArgument if either has the wrong size (nothing changes: call
  // FailScheduled); Internal if the KV manager breaks its contract.
  absl::StatusOr<std::vector<RequestOutput>> UpdateFromOutput(const SchedulerOutput& scheduled,
                                                             std::span<const float> logits,
                                                             std::span<const int32_t> argmax_token_ids = {});

  // The runner ran only the swaps of `scheduled` (a block it onboarded failed its
  // checksum: ModelOutput::swap_in_mismatch): every sequence with a chunk in it is
  // preempted, to be computed again from the blocks that are intact (the corrupt ones
  // were never registered as cached, and the host tier has dropped them). Internal if
  // the KV manager breaks its contract.
  absl::Status RetryScheduled(const SchedulerOutput& scheduled);

  // The runner failed on `scheduled`: every request with a sequence in it ends with
  // finish_reason kError and `error` as its status, and all its blocks are freed.
  std::vector<RequestOutput> FailScheduled(const SchedulerOutput& scheduled, const absl::Status& error);

  // Ends a request in any state (waiting, running, preempted, mid-prefill, forked) and
  // frees all its blocks at once. The returned final output reports every unfinished
  // sample with finish_reason kAbort. FailedPrecondition for an unknown (or already
  // finished) request.
  absl::StatusOr<RequestOutput> Abort(const std::string& request_id);

  // --- Prefill/decode disaggregation (see the file comment) ---

  // Decode side. Adds a validated request in state kReceiving: allocates the blocks of
  // its whole prompt now (the leading cached blocks come from the prefix cache and count
  // as computed) and never schedules it until committed. Its n sequence slots count
  // against max_num_seqs from now on, so that a commit always fits. Errors, all without
  // side effects: AlreadyExists for an unfinished request of the same id;
  // ResourceExhausted when the pool cannot supply the blocks or max_num_seqs would be
  // exceeded (no running sequence is preempted for a reservation).
  absl::StatusOr<RemotePrefillReservation> ReserveRemotePrefill(const EngineRequest& request);

  // The KV of a kReceiving request's prompt is in its blocks. n == 1: marks the prompt
  // computed (full blocks enter the prefix cache), records `first_token_id` as the first
  // output as if sampled here (sampler state, logprobs, stop checks) and admits the
  // sequence to the running queue. n > 1: marks all but the last prompt token computed
  // and admits it; the next step recomputes that token, forks and samples all n first
  // tokens as an aggregated engine would (`first_token_id` is then only checked for
  // range). Returns the request's output (possibly final, possibly without outputs for
  // n > 1). FailedPrecondition for an unknown or not-receiving request;
  // InvalidArgument (nothing changes) for a token outside the vocabulary, or missing /
  // mismatched logprobs when the request asked for logprobs.
  absl::StatusOr<RequestOutput> CommitRemotePrefill(const std::string& request_id, int32_t first_token_id,
                                                    const std::optional<SampleResult>& first_token_logprobs);

  // Prefill side. Queues a validated request that stops after its prompt: once the last
  // prompt chunk ran, sample 0's first token is sampled (no stop checks: the decode side
  // applies them), the sequence turns kPrefilled with its blocks pinned, and its output
  // carries a PrefillResult (not final). n is treated as 1. AlreadyExists as AddRequest.
  absl::Status AddPrefillOnlyRequest(const EngineRequest& request, int32_t num_skipped_blocks);

  // Ends a kPrefilled request: frees its blocks (its full blocks stay cached) and returns
  // its final output (finish_reason kLength: its one token was all it was to produce).
  // FailedPrecondition for an unknown request or one that is not kPrefilled.
  absl::StatusOr<RequestOutput> ReleasePrefill(const std::string& request_id);

  // Ends a request in any state with finish_reason kError and `error` as its status, and
  // frees its blocks (a failed or expired handoff). FailedPrecondition for an unknown
  // request.
  absl::StatusOr<RequestOutput> FailRequest(const std::string& request_id, const absl::Status& error);

  // The status of a request's first sequence; nullopt for an unknown request.
  std::optional<SequenceStatus> FirstSequenceStatus(const std::string& request_id) const;

  // Decode side, a remote prefill that failed before it landed: frees the request's
  // leased blocks and queues it (at the front) for a prefill here, sampler and outputs
  // untouched. FailedPrecondition unless the request is receiving a remote prefill.
  absl::Status RequeueRemotePrefill(const std::string& request_id);

  // Requests still waiting for their first scheduling that have streamed nothing: what
  // a draining worker can hand back for placement elsewhere. In queue order.
  std::vector<std::string> UnstartedRequests() const;
  // The KV id of a request's first sequence (what ScheduledChunk::kv_id names; kept
  // across preemption); nullopt for an unknown request.
  std::optional<kv::RequestId> FirstSequenceKvId(const std::string& request_id) const;

  bool HasUnfinishedRequests() const { return !requests_.empty(); }
  bool HasRequest(const std::string& request_id) const { return requests_.contains(request_id); }
  // Whether an unfinished sequence has this KV id.
  bool HasSequence(kv::RequestId kv_id) const { return seqs_.contains(kv_id); }
  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }

  // Internal unless: every running sequence holds a KV table whose computed count equals
  // its own, no waiting sequence holds one, every parked (receiving / prefilled) one
  // does, each unfinished sequence is in exactly one queue, and the KV manager's own
  // invariants hold. For tests.
  absl::Status CheckInvariants() const;

 private:
  // Hashes of prompt blocks that running sequences have not finished computing.
  absl::flat_hash_set<kv::BlockHash> InFlightBlockHashes() const;
  Scheduler(const SchedulerOptions& options, kv::KvCacheManager& kv, int32_t vocab_size);

  // Creates the request and its first sequence (queued nowhere yet). AlreadyExists for
  // an unfinished request of the same id.
  absl::StatusOr<Sequence*> CreateRequest(const EngineRequest& request);
  // Drops a request that CreateRequest made and that holds nothing yet.
  void DiscardNewRequest(Sequence* seq);

  // Pending tokens to schedule for `seq` under `budget` (before the no-chunking rule).
  int32_t NumNewTokens(const Sequence& seq, int32_t budget) const;
  // Sequence slots taken by running sequences, counting the samples unforked requests
  // will fork into.
  int32_t NumRunningSlots() const;
  // The running sequence to preempt next: an index into running_.
  size_t PickVictim() const;
  // Frees `seq`'s blocks, resets it to recompute and requeues it; drops it from `out`
  // if it was scheduled there (returning its budget to `budget`).
  absl::Status Preempt(Sequence* seq, SchedulerOutput* out, int32_t* budget);
  void EnqueueWaiting(Sequence* seq, bool front);
  // Moves the KV manager's queued tier copies into the step.
  void AddSwaps(kv::KvSwaps swaps, SchedulerOutput* out);
  // Records `seq`'s chunk; the batch is assembled at the end of Schedule.
  void AddChunk(Sequence* seq, int32_t num_new, const kv::KvAllocation& alloc, SchedulerOutput* out);
  // Forks the remaining n-1 samples of `seq`'s request off sample 0.
  absl::Status Fork(Sequence* parent);
  // Samples the next token of `seq` from `row`; on a sampler error fails the request.
  absl::Status SampleNext(Sequence* seq, std::span<const float> row);
  // Creates `seq`'s sampler on its first sample.
  absl::Status EnsureSampler(Sequence* seq);
  // Whether the greedy token is all `seq` needs from its logits (see ArgmaxSuffices' body).
  bool ArgmaxSuffices(const Sequence& seq) const;
  // Appends the runner's greedy token `token_id` (-1: no finite logit, an error) as
  // SampleNext would have sampled it.
  absl::Status TakeArgmax(Sequence* seq, int32_t token_id);
  // Appends the prompt logprobs that a chunk's rows (one per token, from position
  // `start`) give and `request` does not have yet.
  void CollectPromptLogprobs(RequestState* request, int32_t start, std::span<const float> chunk_logits) const;
  // Appends `result.token_id` as `seq`'s next output (sampler, pending output and
  // logprobs) and, unless the request is prefill-only, applies the stop checks.
  void AppendOutputToken(Sequence* seq, SampleResult result);
  // A prefill-only sequence has its first token: park it kPrefilled with its blocks.
  void HoldPrefilled(Sequence* seq);
  void RemoveFromParked(Sequence* seq);
  // Marks `seq` finished and frees its blocks.
  void FinishSequence(Sequence* seq, CompletionFinishReason reason);
  // Collects the pending output of `request` (clearing it); removes the request when it
  // is finished.
  RequestOutput TakeOutput(RequestState* request, const absl::Status& status);
  // Ends every unfinished sample of `request` with `reason` (abort / error).
  void EndRequest(RequestState* request, CompletionFinishReason reason);
  bool Before(const Sequence& a, const Sequence& b) const;  // queue order under the policy
  void RemoveFromRunning(Sequence* seq);
  void RemoveFromWaiting(Sequence* seq);
  // Has the next batch that runs tell the runner to forget `seq`'s table (if it keeps one).
  void ReleaseRunnerTable(Sequence* seq);
  // Frees `seq`'s blocks, and ReleaseRunnerTable.
  absl::Status FreeKv(Sequence* seq);
  // Fills the batch chunk for `chunk`: its tokens, and its block table, whole or as the
  // delta the runner lacks (SchedulerOptions::runner_keeps_block_tables).
  SequenceChunk MakeSequenceChunk(const ScheduledChunk& chunk);

  const SchedulerOptions options_;
  kv::KvCacheManager& kv_;
  const int32_t vocab_size_;
  absl::flat_hash_map<std::string, std::unique_ptr<RequestState>> requests_;
  absl::flat_hash_map<kv::RequestId, Sequence*> seqs_;  // unfinished sequences by KV id
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order (children right after their parent)
  std::vector<Sequence*> parked_;   // kReceiving and kPrefilled: hold blocks, never scheduled
  int64_t next_kv_id_ = 0;
  // KV ids whose runner tables ended since the last batch that ran (its released_seq_ids).
  std::vector<int64_t> released_runner_tables_;
  int64_t next_arrival_ = 0;
  int64_t next_creation_ = 0;
  SchedulerStats stats_;
  KvLoadGate load_gate_{kv_, stats_};
};

}  // namespace kvmesh::engine
