// Engine: one worker's continuous-batching loop (docs/architecture.md §4): schedule → execute
// → sample → emit. It owns the KV cache manager and the Scheduler and borrows a
// ModelRunner. A service drives it from one thread: AddRequest / Abort as requests come
// and go, Step() in a loop while HasUnfinishedRequests().
//
// Guarantees:
//   - AddRequest validates everything before queuing (ValidateEngineRequest); a rejected
//     request allocates nothing.
//   - Every accepted request gets exactly one final output (finished == true): by stop,
//     length, Abort ("abort") or failure ("error"), delivered through Step/Abort's return
//     value and, if set, its on_output callback.
//   - A runner failure fails the requests of that batch (kError outputs carrying the
//     runner's status) and frees their blocks; the engine stays consistent and the other
//     requests continue.
//   - A request's tokens do not depend on batching, chunking, prefix hits or preemption
//     (given a batch-invariant runner): preemption recomputes and keeps the sampler.
//   - Prefill/decode disaggregation (kv_handoff.h): a decode engine grants leases on
//     blocks for remote prefills (ReserveForRemotePrefill → ImportKvBlock* →
//     CommitRemotePrefill | FailRemotePrefill | Abort | lease timeout), and a prefill
//     engine computes prompts whose blocks it pins for export (AddPrefillOnlyRequest →
//     PrefillResult output → ExportKvBlock* → ReleasePrefill | Abort | release
//     timeout). Every ending frees or hands over every block; timeouts are reclaimed at
//     the start of Step, so a driver keeps stepping while HasUnfinishedRequests().
//
// Thread-safety: not thread-safe; owned by the engine loop. Other threads post into a
// queue that the loop drains between steps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kv_handoff.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/request_validator.h"
#include "engine/scheduler.h"
#include "kv/busy_bandwidth.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_connector.h"

namespace kvmesh::engine {

// The lower KV tiers under the engine's pool (kv/kv_tiers.h). Off unless
// host_cache_bytes > 0.
struct EngineKvTierOptions {
  int64_t host_cache_bytes = 0;  // --kv-host-cache-bytes
  // Where the host tier's memory comes from (pinned or managed memory on a CUDA worker);
  // empty: plain host memory with huge pages.
  std::function<std::byte*(int64_t bytes)> host_allocate;
  std::function<void(std::byte*)> host_deallocate;
  std::string disk_cache_dir;    // --kv-disk-cache-dir; empty: no disk tier
  int64_t disk_cache_bytes = 0;  // --kv-disk-cache-bytes
  // Fingerprint of the model the KV belongs to: the disk tier's records carry it and
  // records of another model are skipped at start-up.
  uint64_t model_identity = 0;
  // --kv-offload-policy=write-through: every block tier 0 caches is copied to the host
  // tier at once, instead of when it is evicted (write-back, the default).
  bool write_through = false;
  // Connectors below the disk tier (kv/kv_connector.h: the cluster kv-store), asked after
  // it. Called once, with the runner's host-slot shape and bytes (every connector moves
  // whole host slots); null: none. Needs host_cache_bytes: blocks land in the host tier.
  std::function<absl::StatusOr<std::vector<std::unique_ptr<kv::KvConnector>>>(const KvSlotShape& shape,
                                                                             int64_t slot_bytes)>
      make_connectors;
};

struct EngineOptions {
  SchedulerOptions scheduler;
  EngineKvTierOptions tiers;
  // num_blocks == 0: the runner's num_blocks(). block_size_tokens must equal the runner's.
  // With record_events on, the owner drains DrainKvEvents() every step.
  kv::KvCacheManagerOptions kv;
  // Prompt + generated tokens per sample; required (the model's context length, or less).
  int32_t max_model_len = 0;
  int32_t max_logprobs = kDefaultMaxLogprobs;

  // Prefill/decode disaggregation timeouts (<= 0: never).
  // Decode side: a remote-prefill lease neither committed nor failed within this is
  // reclaimed by Step (blocks freed, the request ends with a DeadlineExceeded error).
  int64_t lease_timeout_ms = 60'000;
  // Prefill side: a computed prefill-only request not released within this is released
  // by Step (the request ends with a DeadlineExceeded error).
  int64_t prefill_release_timeout_ms = 60'000;
  // Monotonic milliseconds for those timeouts; nullptr: std::chrono::steady_clock.
  // Tests inject a fake clock here.
  std::function<int64_t()> now_ms;
};

// Point-in-time counters for metrics. Totals are since Create.
struct EngineStats {
  int32_t num_unfinished_requests = 0;
  int32_t num_running_seqs = 0;
  int32_t num_waiting_seqs = 0;
  int32_t num_receiving_seqs = 0;  // decode side: open remote-prefill leases
  int32_t num_prefilled_seqs = 0;  // prefill side: computed prefills holding their blocks
  // KV pool: used + free + cached == num_kv_blocks.
  int32_t num_kv_blocks = 0;
  int32_t num_kv_blocks_used = 0;
  int32_t num_kv_blocks_free = 0;
  int32_t num_kv_blocks_cached = 0;
  double kv_usage = 0;  // used / total
  // Prefix cache (lookups happen at each admission attempt, retries included).
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t prefix_cache_query_tokens = 0;
  int64_t prefix_cache_hit_tokens = 0;
  // Work done: prefill tokens actually computed (cache hits excluded, recomputation after
  // preemption included) and decode tokens.
  int64_t num_prefill_tokens = 0;
  int64_t num_decode_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_deferred_for_prefix = 0;  // admissions put off a step to share an in-flight prefix
  int64_t num_steps = 0;            // steps that ran a batch
  int64_t num_runner_failures = 0;  // steps whose Execute failed
  // Steps run again because a block onboarded from the host tier failed its checksum
  // (ModelOutput::swap_in_mismatch): their sequences were preempted and recomputed.
  int64_t num_swap_in_retries = 0;
  int64_t num_finished_requests = 0;
  int64_t num_aborted_requests = 0;
  int64_t num_failed_requests = 0;
  int32_t last_batch_num_seqs = 0;
  int32_t last_batch_num_tokens = 0;
  // Remote-prefill leases (decode side): granted = committed + failed + expired +
  // aborted + open.
  int64_t num_leases_granted = 0;
  int64_t num_leases_committed = 0;
  int64_t num_leases_failed = 0;
  int64_t num_leases_expired = 0;
  int64_t num_leases_aborted = 0;
  // Failed leases whose request was prefilled here instead (FallBackToLocalPrefill).
  int64_t num_remote_prefill_fallbacks = 0;
  // Prefill-only requests (prefill side) whose release timed out.
  int64_t num_prefill_releases_expired = 0;
  // Blocks that nothing live should be holding: held by no live request, leased or
  // pinned past their deadline, host slots pinned by a lookup nobody used, or
  // held for a disk load whose request is gone. Always 0
  // unless something leaks (kvmesh_kv_blocks_stranded). Quarantined blocks count once
  // their quarantine has lasted a lease timeout.
  int64_t num_kv_blocks_stranded = 0;
  // Blocks of failed remote-prefill leases kept out of the pool while a transport's
  // writer may still write into them (ExpectDirectKvWrites); also counted as used.
  int64_t num_kv_blocks_quarantined = 0;
  // Lower tiers (all zero without them).
  bool has_host_tier = false;
  bool has_disk_tier = false;
  bool has_store_tier = false;  // a kv-store connector (--kv-store)
  kv::KvTierStats host_tier;
  kv::KvTierStats disk_tier;
  kv::KvTierStats store_tier;
  kv::KvTiersStats tiers;
  double tier_call_seconds = 0;  // time inside the tiers' calls (KvCacheManager::tier_call_seconds)
  int32_t host_tier_slots = 0;
  int32_t host_tier_resident = 0;
  int64_t disk_tier_records = 0;
  int64_t prefix_cache_host_hit_tokens = 0;
  int64_t num_waiting_for_disk = 0;
  int64_t num_waiting_for_lookup = 0;  // admissions put off a step for a connector's lookup in flight
  int64_t num_disk_blocks_lost = 0;  // read from disk, gone again before use (SchedulerStats)
  int64_t num_disk_loads_deferred = 0;  // steps a first load waited for room among load holds
  double prefill_tokens_per_second = 0;  // measured on prefill-heavy steps (0: not yet)
};

class Engine {
 public:
  // `runner` must outlive the engine. InvalidArgument for invalid options: max_model_len
  // < 1, scheduler options, a KV block size other than the runner's, more KV blocks than
  // the runner has, or chunked prefill off with max_num_batched_tokens < max_model_len
  // (a long prompt could never be scheduled).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options, ModelRunner& runner);

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. InvalidArgument (see ValidateEngineRequest: empty prompt, token
  // outside the vocabulary, too long for max_model_len, bad sampling params, n too large,
  // more KV than the whole pool); AlreadyExists if an unfinished request has this id.
  // On error nothing is queued or allocated.
  absl::Status AddRequest(EngineRequest request);

  // Ends a request in any state and frees its blocks at once; returns (and streams) its
  // final output, every unfinished sample with finish_reason "abort".
  // FailedPrecondition for an unknown or already finished request id.
  absl::StatusOr<RequestOutput> Abort(const std::string& request_id);

  // One iteration: schedule, run the batch, sample, update, and return (and stream) the
  // outputs of the requests that changed. Empty when nothing could run. A runner error
  // is not an error of Step: its requests end with kError outputs. Internal only for a
  // broken invariant, after which the engine must be discarded.
  absl::StatusOr<std::vector<RequestOutput>> Step();

  // ---- Decode side of prefill/decode disaggregation ----

  // Accepts a request whose prompt another engine prefills. Validates it as AddRequest
  // does, allocates blocks for its whole prompt (reusing the local prefix cache) and
  // grants a lease on them; the request then waits, unscheduled, for one of
  // CommitRemotePrefill / FailRemotePrefill / Abort / the lease timeout. Its n sequence
  // slots count against max_num_seqs until it ends. Errors, all without side effects:
  // InvalidArgument and AlreadyExists as AddRequest; ResourceExhausted when the KV pool
  // or max_num_seqs has no room now (nothing is preempted for it: retry or place it
  // elsewhere); FailedPrecondition if the model runner exposes no KvStorage.
  absl::StatusOr<RemotePrefillLease> ReserveForRemotePrefill(EngineRequest request);

  // Copies `data`, tensor-parallel rank `rank`'s KV of block `block_index` of the lease
  // (its position in lease.block_ids) in layer `layer`, into that rank's KV storage
  // (rank 0 without TP). FailedPrecondition for a lease that is unknown, committed,
  // failed, aborted or expired (even before Step reclaimed it); InvalidArgument for a
  // rank, layer or block index out of range, or a block
  // below num_cached_blocks() (served by the local prefix cache, possibly shared: never
  // overwritten); DataLoss when data.size() is not the layout's block bytes (a
  // truncated transfer or a sender with another layout). Nothing is written on error.
  absl::Status ImportKvBlock(KvTransferId transfer_id, int32_t rank, int32_t layer, int32_t block_index,
                             std::span<const std::byte> data);

  // The lease's blocks hold the prompt's KV (written through ImportKvBlock or by a
  // transport that writes the storage directly): marks the prompt computed, registers
  // its full blocks in the prefix cache, records `first_token_id` (with its logprobs
  // when the request asked for them) as the first output — stop checks apply, it
  // streams like a sampled token — and admits the request to the running batch. A
  // seeded sampler continues as if it had drawn the first token itself.
  // NOTE n > 1: the first token is only range-checked; the last prompt token is
  // recomputed at the next step and all n samples draw their first token from its
  // logits, then fork (sample 0 equals the prefill side's token for greedy or seeded
  // requests).
  // Returns (and streams, unless it carries nothing) the request's output.
  // FailedPrecondition for a lease that is not open (as ImportKvBlock), or when some but
  // not all transferable blocks were imported; InvalidArgument (nothing changes, the
  // lease stays open) for a token outside the vocabulary or missing / mismatched logprobs.
  absl::StatusOr<RequestOutput> CommitRemotePrefill(KvTransferId transfer_id, int32_t first_token_id,
                                                    std::optional<SampleResult> first_token_logprobs = std::nullopt);

  // The transfer failed: frees the lease's blocks and ends the request with
  // finish_reason "error" and `status`; returns (and streams) that final output. A retry
  // takes a new lease. InvalidArgument for an OK `status`; FailedPrecondition for a lease
  // that is not open.
  absl::StatusOr<RequestOutput> FailRemotePrefill(KvTransferId transfer_id, absl::Status status);

  // The transfer failed before its KV landed (the prefill worker died, hung or refused)
  // and this engine prefills the request itself: the lease ends as failed (its blocks
  // are freed: what landed may be partial) and the request goes to the front of the
  // waiting queue, its callback kept, so the client gets tokens rather than `why`.
  // FailedPrecondition for a lease that is not open (the request ended meanwhile).
  absl::Status FallBackToLocalPrefill(KvTransferId transfer_id, const absl::Status& why);

  // The transport writes the open lease's blocks itself, and a writer of its may outlive
  // the lease (a same-host write stopped mid-way: kv/transport/kv_transport.h,
  // on_released). Until KvWritersGone, an end of the lease other than a commit
  // (failure, fallback, abort, expiry) quarantines its transferred blocks: the request
  // ends (or is prefilled again, in other blocks) at once, but those blocks stay out of
  // the pool, counted as used and num_kv_blocks_quarantined. No-op for a lease that is
  // not open.
  void ExpectDirectKvWrites(KvTransferId transfer_id);
  // The transport says no writer of the lease can write any more: a quarantine of its
  // blocks ends (they return to the pool), or the open lease's end quarantines nothing.
  // No-op for an unknown or committed lease.
  void KvWritersGone(KvTransferId transfer_id);

  // Ends every request that waits for its first scheduling and streamed nothing yet,
  // with `status` (a draining worker hands them back for placement elsewhere); returns
  // (and streams) their final outputs. InvalidArgument for an OK `status`.
  absl::StatusOr<std::vector<RequestOutput>> HandBackUnstarted(const absl::Status& status);

  // ---- Prefill side of prefill/decode disaggregation ----

  // Queues a request that stops after its prompt: it is scheduled like any other
  // (chunked prefill, prefix cache, preemption), samples sample 0's first token without
  // stop checks (the decode side applies them), then keeps its blocks pinned and emits
  // one output carrying a PrefillResult (not final). The request ends with
  // ReleasePrefill (final output "length"), Abort, or the release timeout (final output
  // "error", DeadlineExceeded). n > 1 is accepted and computed as n == 1.
  // `skip_leading_tokens`: leading prompt tokens the receiver already holds
  // (lease.num_cached_tokens); reported as PrefillResult::num_skipped_blocks.
  // `on_layer_blocks` (optional): streams the prompt's KV out layer by layer while it
  // is computed (kv_handoff.h, "Layered streaming"); every block from
  // num_skipped_blocks on, in every layer, goes through it once before the PrefillResult
  // output. ExportKvBlock still works afterwards.
  // InvalidArgument / AlreadyExists as AddRequest, and InvalidArgument for a
  // skip_leading_tokens that is negative, not a multiple of the block size or not
  // below the prompt length; FailedPrecondition for a sink on a runner without KvStorage.
  absl::Status AddPrefillOnlyRequest(EngineRequest request, int32_t skip_leading_tokens = 0,
                                     KvLayerSink on_layer_blocks = nullptr);

  // Rank `rank`'s KV of block `block_index` (its position in PrefillResult::block_ids)
  // of layer `layer` of a computed prefill-only request, in that rank's storage (rank 0
  // without TP). Valid until the
  // request ends (ReleasePrefill, Abort, release timeout); the engine never writes a
  // pinned block meanwhile. FailedPrecondition for a request that is unknown, not yet
  // computed or ended, or a runner without KvStorage; InvalidArgument for an index out
  // of range.
  absl::StatusOr<std::span<const std::byte>> ExportKvBlock(const std::string& request_id, int32_t rank,
                                                           int32_t layer, int32_t block_index) const;

  // Ends a computed prefill-only request: unpins its blocks (its full blocks stay in
  // the prefix cache) and returns (and streams) its final output. FailedPrecondition
  // for a request that is unknown or not computed yet (Abort it instead).
  absl::StatusOr<RequestOutput> ReleasePrefill(const std::string& request_id);

  // This engine's KV block layout (one rank's pool under TP), what a peer's blocks must
  // match. FailedPrecondition when the runner has no KV pool layout (a fake).
  absl::StatusOr<kv::KvBlockSpec> kv_block_spec() const;
  // The shared key spaces of its KV connectors (KvConnector::shared_key_space: the
  // cluster kv-store's), in connector order; empty without one.
  std::vector<kv::SharedKeySpace> shared_kv_key_spaces() const;
  // Tensor-parallel ranks whose pools a transfer moves (ModelRunner::kv_rank_storages):
  // 1 without TP (also for a device pool with no host mirror), 0 when the runner has no
  // KV pool layout.
  int32_t kv_tp_size() const {
    if (!kv_ranks_.empty()) return static_cast<int32_t>(kv_ranks_.size());
    return kv_layout_.has_value() ? 1 : 0;
  }

  bool HasUnfinishedRequests() const { return scheduler_->HasUnfinishedRequests(); }
  EngineStats stats() const;
  // KV events since the last call (empty when options.kv.record_events is off).
  std::vector<kv::KvEvent> DrainKvEvents() { return kv_->DrainEvents(); }

  const RequestLimits& limits() const { return limits_; }
  const kv::KvCacheManager& kv_cache() const { return *kv_; }
  const Scheduler& scheduler() const { return *scheduler_; }

 private:
  // A prefill-only request whose KV streams out through a sink (prefill side).
  struct StreamedPrefill {
    kv::RequestId kv_id;
    KvLayerSink sink;
    int32_t num_prompt_tokens = 0;
    int32_t next_block = 0;  // blocks below this have gone out, in every layer
  };
  // One streamed prefill's share of a step: prompt blocks [first_block_index, +size).
  struct LayerExport {
    const KvLayerSink* sink = nullptr;
    int32_t first_block_index = 0;
    std::vector<kv::BlockId> block_ids;
  };

  Engine(const EngineOptions& options, ModelRunner& runner, std::unique_ptr<kv::KvCacheManager> kv,
         std::unique_ptr<Scheduler> scheduler, const RequestLimits& limits);

  // Runs the lower-tier copies queued outside a step (a reservation's evictions and
  // onboards) at once, before anyone writes the blocks directly.
  absl::Status RunPendingTierCopies();
  // Hands a step's swaps back to the tiers: committed with the runner's checksums and
  // times when `result` is OK, dropped (offloads aborted) when the step failed.
  void FinishSwaps(const kv::KvSwaps& swaps, const absl::StatusOr<ModelOutput>& result);
  // Folds one step's prefill speed into the load-versus-recompute estimate.
  void RecordStepSpeed(const SchedulerOutput& scheduled, const ModelOutput& output, double seconds);
  int64_t CountStrandedBlocks() const;

  // Invokes the callbacks of `outputs`; forgets those of finished requests, and keeps
  // the lease / pinned-prefill tables in step with them.
  void Deliver(const std::vector<RequestOutput>& outputs);
  int64_t NowMs() const;
  int64_t DeadlineAfter(int64_t timeout_ms) const;
  // Ends expired leases and pinned prefills (DeadlineExceeded); returns their delivered
  // final outputs.
  std::vector<RequestOutput> ReclaimExpired();
  // Ends a lease in the ledger, holding the blocks it quarantines (ExpectDirectKvWrites)
  // out of the pool.
  void CloseLease(KvTransferId id, kv::KvHandoffLedger::LeaseEnd end);
  // The blocks this step completes for each streamed prefill in `scheduled` (advancing
  // their next_block); empty when none streams.
  std::vector<LayerExport> PlanLayerExports(const SchedulerOutput& scheduled);
  // Hands `layer`'s planned blocks to their sinks (the runner's per-layer hook).
  void ExportLayer(const std::vector<LayerExport>& plan, int32_t layer);
  // Before a computed prefill's PrefillResult is delivered: a streamed one sends whatever
  // the steps did not (defensive: the last chunk normally completes every block) and is
  // forgotten; any other has its blocks copied into the runner's host view for
  // ExportKvBlock (ModelRunner::CopyKvToHostMirror). An error means its KV cannot leave.
  absl::Status MakePrefillExportable(const std::string& request_id, const PrefillResult& result);

  ModelRunner& runner_;
  const std::vector<kv::KvStorage*> kv_ranks_;  // runner_.kv_rank_storages(), fixed for its life
  const std::optional<kv::KvLayout> kv_layout_;  // runner_.kv_pool_layout()
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;  // borrows *kv_: declared after it
  const RequestLimits limits_;
  absl::flat_hash_map<std::string, std::function<void(const RequestOutput&)>> callbacks_;
  int64_t num_steps_ = 0;
  int64_t num_runner_failures_ = 0;
  int64_t num_swap_in_retries_ = 0;

  // Disaggregation state: the Scheduler holds the sequences, the ledger every lease
  // and export pin (their one owner), streamed_prefills_ the layer sinks.
  const int64_t lease_timeout_ms_;
  const int64_t prefill_release_timeout_ms_;
  const std::function<int64_t()> now_ms_;
  kv::KvHandoffLedger handoffs_;
  int64_t num_remote_prefill_fallbacks_ = 0;
  // Prefill tokens per second of compute on prefill-heavy steps: what recomputing costs,
  // for the tiers' load-versus-recompute and the scheduler's placement; the same
  // estimator as the tiers' bandwidths (units per busy second, decaying).
  kv::BusyBandwidth prefill_rate_{{.half_life_seconds = kv::kDefaultBandwidthHalfLifeSeconds}};
  // By request id; node map: LayerExport points at the sinks during a step.
  absl::node_hash_map<std::string, StreamedPrefill> streamed_prefills_;
};

}  // namespace kvmesh::engine
