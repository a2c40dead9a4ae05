#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvmesh::engine {
namespace {

// The KV manager only fails this way when the scheduler or the manager has a bug.
absl::Status KvBroken(const absl::Status& s, const char* what) {
  return absl::InternalError(absl::StrCat("scheduler: ", what, ": ", s.message()));
}

}  // namespace

absl::Status SchedulerOptions::Validate() const {
  if (max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_batched_tokens must be at least 1, got ", max_num_batched_tokens));
  }
  if (max_num_seqs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_num_seqs must be at least 1, got ", max_num_seqs));
  }
  if (long_prefill_token_threshold < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("long_prefill_token_threshold must be >= 0, got ", long_prefill_token_threshold));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerOptions& options,
                                                             kv::KvCacheManager& kv, int32_t vocab_size) {
  KVMESH_RETURN_IF_ERROR(options.Validate());
  if (vocab_size < 1) return absl::InvalidArgumentError(absl::StrCat("vocab_size must be positive, got ", vocab_size));
  return std::unique_ptr<Scheduler>(new Scheduler(options, kv, vocab_size));
}

Scheduler::Scheduler(const SchedulerOptions& options, kv::KvCacheManager& kv, int32_t vocab_size)
    : options_(options), kv_(kv), vocab_size_(vocab_size) {}

absl::StatusOr<Sequence*> Scheduler::CreateRequest(const EngineRequest& request) {
  if (requests_.contains(request.request_id)) {
    return absl::AlreadyExistsError(absl::StrCat("request id '", request.request_id, "' is already in use"));
  }
  const int64_t arrival = request.arrival_order >= 0 ? request.arrival_order : next_arrival_++;
  auto state = std::make_unique<RequestState>(request, arrival);
  auto seq = std::make_unique<Sequence>();
  Sequence* raw = seq.get();
  seq->request = state.get();
  seq->kv_id = kv::RequestId{next_kv_id_++};
  seq->sample_index = 0;
  seq->creation_order = next_creation_++;
  seq->token_ids = request.prompt_token_ids;
  // A resumed request prefills its earlier outputs too, as a recompute after preemption.
  seq->token_ids.insert(seq->token_ids.end(), request.resume_output_token_ids.begin(),
                        request.resume_output_token_ids.end());
  seq->num_prefill_tokens = seq->num_tokens();
  seqs_[seq->kv_id] = raw;
  state->seqs.push_back(std::move(seq));
  requests_.emplace(request.request_id, std::move(state));
  return raw;
}

void Scheduler::DiscardNewRequest(Sequence* seq) {
  seqs_.erase(seq->kv_id);
  requests_.erase(seq->request->request_id);  // destroys `seq`
}

absl::Status Scheduler::AddRequest(const EngineRequest& request) {
  KVMESH_ASSIGN_OR_RETURN(Sequence * seq, CreateRequest(request));
  EnqueueWaiting(seq, /*front=*/false);
  return absl::OkStatus();
}

absl::Status Scheduler::AddPrefillOnlyRequest(const EngineRequest& request, int32_t num_skipped_blocks) {
  KVMESH_ASSIGN_OR_RETURN(Sequence * seq, CreateRequest(request));
  RequestState* state = seq->request;
  state->prefill_only = true;
  state->n = 1;  // the KV is what is wanted; the decode side forks
  state->num_skipped_blocks = num_skipped_blocks;
  EnqueueWaiting(seq, /*front=*/false);
  return absl::OkStatus();
}

absl::StatusOr<RemotePrefillReservation> Scheduler::ReserveRemotePrefill(const EngineRequest& request) {
  if (requests_.contains(request.request_id)) {
    return absl::AlreadyExistsError(absl::StrCat("request id '", request.request_id, "' is already in use"));
  }
  if (NumRunningSlots() + request.n > options_.max_num_seqs) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot reserve a remote prefill for '", request.request_id,
                                                     "': ", NumRunningSlots(), " of max_num_seqs ",
                                                     options_.max_num_seqs, " sequence slots are taken"));
  }
  KVMESH_ASSIGN_OR_RETURN(Sequence * seq, CreateRequest(request));
  kv::ComputedPrefix prefix = kv_.FindCachedPrefix(seq->token_ids, seq->request->cache_salt);
  // NOTE: a remote prefill does not wait for a disk load: the prefill side computes
  // whatever tier 0 and the host tier do not hold.
  absl::StatusOr<kv::KvAllocation> alloc =
      kv_.AllocateSlots(seq->kv_id, seq->token_ids, seq->num_tokens() - prefix.num_tokens, &prefix);
  if (!alloc.ok()) {
    kv_.ReleasePrefix(prefix);
    DiscardNewRequest(seq);
    if (alloc.status().code() == absl::StatusCode::kResourceExhausted) return alloc.status();
    return KvBroken(alloc.status(), "AllocateSlots for a remote prefill");
  }
  // NOTE: a fresh table has nothing shared to copy on write: alloc->copies is empty.
  seq->status = SequenceStatus::kReceiving;
  seq->num_computed_tokens = prefix.num_tokens;
  seq->admitted_block_hashes = std::move(prefix.block_hashes);
  seq->request->num_cached_prompt_tokens = prefix.num_tokens;
  seq->request->times.first_scheduled = std::chrono::steady_clock::now();
  parked_.push_back(seq);
  RemotePrefillReservation reservation;
  reservation.kv_id = seq->kv_id;
  const std::span<const kv::BlockId> table = kv_.block_table(seq->kv_id);
  reservation.block_ids.assign(table.begin(), table.end());
  reservation.num_cached_tokens = prefix.num_tokens;
  return reservation;
}

absl::StatusOr<RequestOutput> Scheduler::CommitRemotePrefill(const std::string& request_id, int32_t first_token_id,
                                                             const std::optional<SampleResult>& first_token_logprobs) {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("CommitRemotePrefill: no unfinished request '", request_id, "'"));
  }
  RequestState* request = it->second.get();
  Sequence* seq = request->seqs[0].get();
  if (seq->status != SequenceStatus::kReceiving) {
    return absl::FailedPreconditionError(
        absl::StrCat("CommitRemotePrefill: request '", request_id, "' is not receiving a remote prefill"));
  }
  if (first_token_id < 0 || first_token_id >= vocab_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("first token id ", first_token_id, " is outside the vocabulary [0, ", vocab_size_, ")"));
  }
  const int32_t prompt_len = request->num_prompt_tokens();
  auto admit = [&](int32_t num_computed) -> absl::Status {
    if (absl::Status s = kv_.MarkComputed(seq->kv_id, seq->token_ids, num_computed, request->cache_salt); !s.ok()) {
      return KvBroken(s, "MarkComputed on commit");
    }
    seq->num_computed_tokens = num_computed;
    RemoveFromParked(seq);
    seq->status = SequenceStatus::kRunning;
    running_.push_back(seq);
    return absl::OkStatus();
  };
  if (request->n > 1) {
    // NOTE: n samples need n first tokens drawn from the prompt's logits, which only the
    // prefill side saw. Recomputing the last prompt token here (one token of work) gives
    // them back, and the usual fork-after-prompt path then draws all n, sample 0 exactly
    // as the prefill side did.
    KVMESH_RETURN_IF_ERROR(admit(prompt_len - 1));
    return TakeOutput(request, absl::OkStatus());
  }
  SampleResult result;
  result.token_id = first_token_id;
  if (request->sampling_params.logprobs >= 0) {
    if (!first_token_logprobs.has_value() || first_token_logprobs->token_id != first_token_id) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request '", request_id, "' asked for logprobs: commit its first token with the prefill side's logprobs"));
    }
    result = *first_token_logprobs;
  }
  KVMESH_ASSIGN_OR_RETURN(SequenceSampler sampler,
                          SequenceSampler::Create(request->SampleParams(0), vocab_size_, request->prompt_token_ids,
                                                  request->eos_token_ids));
  if (!request->sampling_params.is_greedy()) {
    // NOTE: a non-greedy Sample() makes exactly one RNG draw. Replaying one on a dummy
    // row leaves the RNG where the prefill side's sampler left it after drawing the
    // first token, so a seeded request continues with the tokens an aggregated engine
    // would draw.
    const std::vector<float> flat(static_cast<size_t>(vocab_size_), 0.0f);
    if (absl::StatusOr<SampleResult> skipped = sampler.Sample(flat); !skipped.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot restore the sampler of request '", request_id, "': ", skipped.status().message()));
    }
  }
  KVMESH_RETURN_IF_ERROR(admit(prompt_len));
  seq->sampler.emplace(std::move(sampler));
  request->forked = true;
  AppendOutputToken(seq, std::move(result));
  return TakeOutput(request, absl::OkStatus());
}

absl::StatusOr<RequestOutput> Scheduler::ReleasePrefill(const std::string& request_id) {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("ReleasePrefill: no unfinished request '", request_id, "'"));
  }
  RequestState* request = it->second.get();
  Sequence* seq = request->seqs[0].get();
  if (!request->prefill_only || seq->status != SequenceStatus::kPrefilled) {
    return absl::FailedPreconditionError(
        absl::StrCat("ReleasePrefill: request '", request_id, "' is not a computed prefill-only request"));
  }
  FinishSequence(seq, CompletionFinishReason::kLength);
  return TakeOutput(request, absl::OkStatus());
}

absl::StatusOr<RequestOutput> Scheduler::FailRequest(const std::string& request_id, const absl::Status& error) {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("FailRequest: no unfinished request '", request_id, "'"));
  }
  RequestState* request = it->second.get();
  EndRequest(request, CompletionFinishReason::kError);
  ++stats_.num_failed_requests;
  return TakeOutput(request, error);
}

absl::Status Scheduler::RequeueRemotePrefill(const std::string& request_id) {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("RequeueRemotePrefill: no unfinished request '", request_id, "'"));
  }
  Sequence* seq = it->second->seqs[0].get();
  if (seq->status != SequenceStatus::kReceiving) {
    return absl::FailedPreconditionError(
        absl::StrCat("RequeueRemotePrefill: request '", request_id, "' is not receiving a remote prefill"));
  }
  // NOTE: the blocks go back to the pool: what the sender wrote into them may be
  // partial, and the local prefill allocates (and prefix-matches) afresh.
  if (absl::Status s = FreeKv(seq); !s.ok()) return KvBroken(s, "Free on a remote prefill's requeue");
  RemoveFromParked(seq);
  seq->num_computed_tokens = 0;
  seq->num_prefill_tokens = seq->num_tokens();
  seq->admitted_block_hashes.clear();
  KvLoadGate::Reset(*seq);
  it->second->num_cached_prompt_tokens = -1;
  EnqueueWaiting(seq, /*front=*/true);
  return absl::OkStatus();
}

std::vector<std::string> Scheduler::UnstartedRequests() const {
  std::vector<std::string> ids;
  for (const Sequence* seq : waiting_) {
    const RequestState* request = seq->request;
    // Nothing streamed from here yet (a resumed request's earlier outputs came from
    // elsewhere, and the caller holds them).
    if (request->prefill_only || seq->num_computed_tokens > 0 ||
        seq->num_output_tokens() > static_cast<int32_t>(request->resume_output_token_ids.size())) {
      continue;
    }
    if (request->seqs.size() == 1) ids.push_back(request->request_id);
  }
  return ids;
}

std::optional<SequenceStatus> Scheduler::FirstSequenceStatus(const std::string& request_id) const {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) return std::nullopt;
  return it->second->seqs[0]->status;
}

std::optional<kv::RequestId> Scheduler::FirstSequenceKvId(const std::string& request_id) const {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) return std::nullopt;
  return it->second->seqs[0]->kv_id;
}

void Scheduler::HoldPrefilled(Sequence* seq) {
  RequestState* request = seq->request;
  RemoveFromRunning(seq);
  ReleaseRunnerTable(seq);  // never scheduled again: the runner need not keep its table
  seq->status = SequenceStatus::kPrefilled;
  parked_.push_back(seq);
  PrefillResult result;
  result.first_token_id = seq->token_ids.back();
  if (!seq->pending_logprobs.empty()) result.first_token_logprobs = seq->pending_logprobs.back();
  const std::span<const kv::BlockId> table = kv_.block_table(seq->kv_id);
  result.block_ids.assign(table.begin(), table.end());
  result.num_cached_tokens = std::max(0, request->num_cached_prompt_tokens);
  result.num_skipped_blocks = request->num_skipped_blocks;
  request->pending_prefill_result = std::move(result);
}

void Scheduler::RemoveFromParked(Sequence* seq) {
  const auto it = std::find(parked_.begin(), parked_.end(), seq);
  if (it != parked_.end()) parked_.erase(it);
}

bool Scheduler::Before(const Sequence& a, const Sequence& b) const {
  return std::tuple(a.request->priority, a.request->arrival_order, a.creation_order) <
         std::tuple(b.request->priority, b.request->arrival_order, b.creation_order);
}

void Scheduler::EnqueueWaiting(Sequence* seq, bool front) {
  seq->status = SequenceStatus::kWaiting;
  if (options_.policy == SchedulerOptions::Policy::kFcfs) {
    if (front) {
      waiting_.push_front(seq);
    } else {
      waiting_.push_back(seq);
    }
    return;
  }
  // kPriority: a preempted sequence returns to its place by key, as a new one does.
  const auto pos = std::upper_bound(waiting_.begin(), waiting_.end(), seq,
                                    [this](const Sequence* a, const Sequence* b) { return Before(*a, *b); });
  waiting_.insert(pos, seq);
}

void Scheduler::RemoveFromRunning(Sequence* seq) {
  const auto it = std::find(running_.begin(), running_.end(), seq);
  if (it != running_.end()) running_.erase(it);
}

void Scheduler::RemoveFromWaiting(Sequence* seq) {
  const auto it = std::find(waiting_.begin(), waiting_.end(), seq);
  if (it != waiting_.end()) waiting_.erase(it);
}

int32_t Scheduler::NumNewTokens(const Sequence& seq, int32_t budget) const {
  int32_t pending = seq.num_tokens() - seq.num_computed_tokens;
  if (options_.enable_chunked_prefill && options_.long_prefill_token_threshold > 0) {
    pending = std::min(pending, options_.long_prefill_token_threshold);
  }
  return std::min(pending, budget);
}

int32_t Scheduler::NumRunningSlots() const {
  int32_t slots = 0;
  for (const Sequence* seq : running_) slots += seq->request->num_seq_slots_if_unforked();
  // A reservation holds its slots: its commit joins the running queue unconditionally.
  for (const Sequence* seq : parked_) {
    if (seq->status == SequenceStatus::kReceiving) slots += seq->request->num_seq_slots_if_unforked();
  }
  return slots;
}

size_t Scheduler::PickVictim() const {
  if (options_.policy == SchedulerOptions::Policy::kFcfs) return running_.size() - 1;
  size_t victim = 0;
  for (size_t i = 1; i < running_.size(); ++i) {
    if (Before(*running_[victim], *running_[i])) victim = i;
  }
  return victim;
}

absl::Status Scheduler::Preempt(Sequence* seq, SchedulerOutput* out, int32_t* budget) {
  for (auto it = out->chunks.begin(); it != out->chunks.end(); ++it) {
    if (it->kv_id == seq->kv_id) {
      // Scheduled earlier in this step (kPriority): give back its budget; its copies go
      // with the chunk, and Free below returns the blocks it was just given.
      *budget += it->num_tokens;
      out->chunks.erase(it);
      break;
    }
  }
  if (absl::Status s = FreeKv(seq); !s.ok()) return KvBroken(s, "Free on preemption");
  RemoveFromRunning(seq);
  // Recompute: everything known so far is the new prefill; outputs and sampler stay.
  seq->num_computed_tokens = 0;
  seq->num_prefill_tokens = seq->num_tokens();
  ++seq->num_preemptions;
  KvLoadGate::Reset(*seq);  // its blocks may be offloaded now: a resume may load them
  ++stats_.num_preemptions;
  ++out->num_preempted;
  EnqueueWaiting(seq, /*front=*/true);
  return absl::OkStatus();
}

void Scheduler::AddChunk(Sequence* seq, int32_t num_new, const kv::KvAllocation& alloc, SchedulerOutput* out) {
  ScheduledChunk chunk;
  chunk.kv_id = seq->kv_id;
  chunk.start_position = seq->num_computed_tokens;
  chunk.num_tokens = num_new;
  chunk.compute_logits = chunk.start_position + num_new == seq->num_tokens();
  // Rows for the prompt logprobs still missing: position p's logits give token p + 1's.
  const RequestState& request = *seq->request;
  const int32_t next = static_cast<int32_t>(request.prompt_logprobs.size());
  chunk.all_logits = request.wants_prompt_logprobs() && seq->sample_index == 0 && chunk.start_position <= next &&
                     next < chunk.start_position + num_new;
  for (const kv::BlockCopy& c : alloc.copies) chunk.block_copies.push_back(KvBlockCopy{c.src.value, c.dst.value});
  out->chunks.push_back(std::move(chunk));
}

absl::flat_hash_set<kv::BlockHash> Scheduler::InFlightBlockHashes() const {
  absl::flat_hash_set<kv::BlockHash> in_flight;
  const int32_t block_size = kv_.block_size_tokens();
  for (const Sequence* seq : running_) {
    // Blocks at or past the first one not yet fully computed.
    for (size_t b = static_cast<size_t>(seq->num_computed_tokens / block_size); b < seq->admitted_block_hashes.size();
         ++b) {
      in_flight.insert(seq->admitted_block_hashes[b]);
    }
  }
  return in_flight;
}

absl::StatusOr<SchedulerOutput> Scheduler::Schedule() {
  SchedulerOutput out;
  int32_t budget = options_.max_num_batched_tokens;

  // 1. Running sequences, in order; preempt from the back (or by priority) on KV pressure.
  size_t i = 0;
  while (i < running_.size() && budget > 0) {
    Sequence* seq = running_[i];
    const int32_t pending = seq->num_tokens() - seq->num_computed_tokens;
    const int32_t num_new = NumNewTokens(*seq, budget);
    if (num_new <= 0 || (!options_.enable_chunked_prefill && num_new < pending)) {
      ++i;  // NOTE: without chunking a running sequence has one pending token; defensive.
      continue;
    }
    bool scheduled = false;
    while (true) {
      absl::StatusOr<kv::KvAllocation> alloc = kv_.AllocateSlots(seq->kv_id, seq->token_ids, num_new);
      if (alloc.ok()) {
        AddChunk(seq, num_new, *alloc, &out);
        budget -= num_new;
        scheduled = true;
        break;
      }
      if (alloc.status().code() != absl::StatusCode::kResourceExhausted) {
        return KvBroken(alloc.status(), "AllocateSlots for a running sequence");
      }
      const size_t v = PickVictim();
      Sequence* victim = running_[v];
      KVMESH_RETURN_IF_ERROR(Preempt(victim, &out, &budget));
      if (v < i) --i;
      if (victim == seq) break;
    }
    if (scheduled) ++i;
  }

  // 2. Waiting sequences, unless this step had to preempt (the pool is tight: vLLM
  // admits nothing new then either).
  if (out.num_preempted == 0) {
    absl::flat_hash_set<kv::BlockHash> in_flight = InFlightBlockHashes();
    load_gate_.BeginPass();
    size_t w = 0;
    while (w < waiting_.size() && budget > 0) {
      Sequence* seq = waiting_[w];
      if (NumRunningSlots() + seq->request->num_seq_slots_if_unforked() > options_.max_num_seqs) break;
      int32_t loaded_end = -1;  // past the blocks the finished load read, if one did
      // Waiting for KV from below the host tier (kv_load_gate.h): later ones may pass it.
      if (load_gate_.StillLoading(*seq, &loaded_end) || load_gate_.StillLookingUp(*seq)) {
        ++w;
        continue;
      }
      // A request that still needs its prompt logprobs computes the whole prompt: a block
      // taken from the prefix cache has no logits.
      kv::ComputedPrefix prefix = seq->request->wants_prompt_logprobs()
                                      ? kv::ComputedPrefix{}
                                      : kv_.FindCachedPrefix(seq->token_ids, seq->request->cache_salt);
      if (load_gate_.AfterLookup(*seq, prefix, loaded_end) == KvLoadGate::Verdict::kWait) {
        ++w;
        continue;
      }
      // NOTE: in-batch prefix sharing. When the first block this request would compute
      // is being computed right now by a running sequence (same hash), defer it: a step
      // later that block is a cache hit instead of duplicate prefill work.
      const size_t first_uncached = static_cast<size_t>(prefix.num_blocks());
      if (first_uncached < prefix.block_hashes.size() && in_flight.contains(prefix.block_hashes[first_uncached])) {
        kv_.ReleasePrefix(prefix);
        ++stats_.num_deferred_for_prefix;
        ++w;
        continue;
      }
      int32_t pending = seq->num_tokens() - prefix.num_tokens;
      if (options_.enable_chunked_prefill && options_.long_prefill_token_threshold > 0) {
        pending = std::min(pending, options_.long_prefill_token_threshold);
      }
      if (!options_.enable_chunked_prefill && pending > budget) {
        kv_.ReleasePrefix(prefix);
        break;
      }
      const int32_t num_new = std::min(pending, budget);
      absl::StatusOr<kv::KvAllocation> alloc = kv_.AllocateSlots(seq->kv_id, seq->token_ids, num_new, &prefix);
      if (!alloc.ok()) {
        kv_.ReleasePrefix(prefix);
        if (alloc.status().code() == absl::StatusCode::kResourceExhausted) break;  // wait for room
        return KvBroken(alloc.status(), "AllocateSlots for a waiting sequence");
      }
      // Admitted: the lookup pinned what it uses, so whatever loads it waited for stop
      // holding the host tier.
      kv_.ReleaseLoadHold(seq->kv_id);
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
      seq->status = SequenceStatus::kRunning;
      seq->num_computed_tokens = prefix.num_tokens;
      seq->admitted_block_hashes = std::move(prefix.block_hashes);
      for (size_t b = first_uncached; b < seq->admitted_block_hashes.size(); ++b) {
        in_flight.insert(seq->admitted_block_hashes[b]);  // later admissions this step see it too
      }
      RequestState* request = seq->request;
      if (request->num_cached_prompt_tokens < 0) {
        request->num_cached_prompt_tokens = std::min(prefix.num_tokens, request->num_prompt_tokens());
        request->times.first_scheduled = std::chrono::steady_clock::now();
      }
      running_.push_back(seq);
      AddChunk(seq, num_new, *alloc, &out);
      budget -= num_new;
    }
  }

  // 3. Assemble the batch from the chunks that survived preemption, with the tier copies
  // the allocations above queued (offloads of evicted blocks, onboards of host hits).
  AddSwaps(kv_.TakeSwaps(), &out);
  for (ScheduledChunk& chunk : out.chunks) {
    const Sequence* seq = seqs_.at(chunk.kv_id);
    chunk.argmax_only = chunk.compute_logits && !chunk.all_logits && options_.argmax_on_runner && ArgmaxSuffices(*seq);
    out.batch.chunks.push_back(MakeSequenceChunk(chunk));
    out.batch.block_copies.insert(out.batch.block_copies.end(), chunk.block_copies.begin(),
                                  chunk.block_copies.end());
    out.num_batched_tokens += chunk.num_tokens;
    out.num_logits_rows += chunk.all_logits ? chunk.num_tokens : chunk.compute_logits && !chunk.argmax_only ? 1 : 0;
    out.num_argmax_rows += chunk.argmax_only ? 1 : 0;
  }
  // Ended tables go with a batch that runs (an empty output is never executed).
  if (!out.empty()) out.batch.released_seq_ids = std::move(released_runner_tables_);
  released_runner_tables_.clear();  // moved-from: make it empty
  stats_.last_batch_num_seqs = static_cast<int32_t>(out.chunks.size());
  stats_.last_batch_num_tokens = out.num_batched_tokens;
  return out;
}

SequenceChunk Scheduler::MakeSequenceChunk(const ScheduledChunk& chunk) {
  Sequence* seq = seqs_.at(chunk.kv_id);
  SequenceChunk sc;
  sc.token_ids.assign(seq->token_ids.begin() + chunk.start_position,
                      seq->token_ids.begin() + chunk.start_position + chunk.num_tokens);
  sc.start_position = chunk.start_position;
  sc.compute_logits = chunk.compute_logits;
  sc.argmax_only = chunk.argmax_only;
  sc.all_logits = chunk.all_logits;
  const std::span<const kv::BlockId> table = kv_.block_table(chunk.kv_id);
  size_t from = 0;
  if (options_.runner_keeps_block_tables) {
    // NOTE: the KV manager only appends to a table and rewrites entries at or past the
    // block of the first uncomputed token (copy-on-write in AllocateSlots and
    // PrepareAppend), and this chunk starts at that token: the entries before its block
    // are as the runner has them. So a decode chunk carries one entry (the block it
    // writes into), whatever the context.
    from = static_cast<size_t>(
        std::min(seq->runner_table_blocks, chunk.start_position / kv_.block_size_tokens()));
    sc.seq_id = chunk.kv_id.value;
    sc.block_table_start = static_cast<int32_t>(from);
    seq->runner_table_blocks = static_cast<int32_t>(table.size());
  }
  sc.block_table.reserve(table.size() - from);
  for (size_t b = from; b < table.size(); ++b) sc.block_table.push_back(table[b].value);
  return sc;
}

void Scheduler::ReleaseRunnerTable(Sequence* seq) {
  if (seq->runner_table_blocks == 0) return;
  released_runner_tables_.push_back(seq->kv_id.value);
  seq->runner_table_blocks = 0;
}

absl::Status Scheduler::FreeKv(Sequence* seq) {
  ReleaseRunnerTable(seq);
  return kv_.Free(seq->kv_id);
}

void AppendSwaps(const kv::KvSwaps& swaps, ModelBatch* batch) {
  for (const kv::KvSwap& s : swaps.out) batch->swap_out.push_back(KvBlockSwap{.block = s.block.value, .host = s.host});
  for (const kv::KvSwap& s : swaps.in) {
    batch->swap_in.push_back(KvBlockSwap{.block = s.block.value, .host = s.host});
    batch->swap_in_checksums.push_back(s.checksum);
  }
}

void Scheduler::AddSwaps(kv::KvSwaps swaps, SchedulerOutput* out) {
  AppendSwaps(swaps, &out->batch);
  out->swaps = std::move(swaps);
}

absl::Status Scheduler::Fork(Sequence* parent) {
  RequestState* request = parent->request;
  auto pos = std::find(running_.begin(), running_.end(), parent);
  for (int32_t index = 1; index < request->n; ++index) {
    auto child = std::make_unique<Sequence>();
    child->request = request;
    child->kv_id = kv::RequestId{next_kv_id_++};
    child->sample_index = index;
    child->creation_order = next_creation_++;
    child->status = SequenceStatus::kRunning;
    child->token_ids = parent->token_ids;
    child->num_computed_tokens = parent->num_computed_tokens;
    child->num_prefill_tokens = parent->num_prefill_tokens;
    if (absl::Status s = kv_.Fork(parent->kv_id, child->kv_id); !s.ok()) return KvBroken(s, "Fork");
    seqs_[child->kv_id] = child.get();
    // Right after the parent and its earlier siblings: a request's samples stay together.
    pos = running_.insert(pos == running_.end() ? pos : pos + 1, child.get());
    request->seqs.push_back(std::move(child));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::EnsureSampler(Sequence* seq) {
  if (seq->sampler.has_value()) return absl::OkStatus();
  const RequestState* request = seq->request;
  KVMESH_ASSIGN_OR_RETURN(SequenceSampler sampler,
                          SequenceSampler::Create(request->SampleParams(seq->sample_index), vocab_size_,
                                                  request->prompt_token_ids, request->eos_token_ids));
  sampler.Resume(request->resume_output_token_ids);
  seq->sampler.emplace(std::move(sampler));
  return absl::OkStatus();
}

absl::Status Scheduler::SampleNext(Sequence* seq, std::span<const float> row) {
  KVMESH_RETURN_IF_ERROR(EnsureSampler(seq));
  KVMESH_ASSIGN_OR_RETURN(SampleResult result, seq->sampler->Sample(row));
  AppendOutputToken(seq, std::move(result));
  return absl::OkStatus();
}

bool Scheduler::ArgmaxSuffices(const Sequence& seq) const {
  const RequestState& request = *seq.request;
  const SamplingParams& p = request.sampling_params;
  // One sample (no fork shares the row), greedy, nothing but the token wanted, and no
  // penalty or min_tokens mask between the logits and their argmax.
  return request.n == 1 && p.is_greedy() && p.logprobs < 0 && p.logit_bias.empty() && p.repetition_penalty == 1.0f &&
         p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f && seq.num_output_tokens() >= p.min_tokens;
}

void Scheduler::CollectPromptLogprobs(RequestState* request, int32_t start,
                                      std::span<const float> chunk_logits) const {
  const int32_t rows = static_cast<int32_t>(chunk_logits.size() / static_cast<size_t>(vocab_size_));
  const int32_t top_n = request->sampling_params.prompt_logprobs;
  // Row i is position start + i; it scores prompt token start + i + 1.
  for (int32_t i = 0; i < rows && request->wants_prompt_logprobs(); ++i) {
    const int32_t position = start + i;
    if (position != static_cast<int32_t>(request->prompt_logprobs.size())) continue;  // had it (recompute)
    request->prompt_logprobs.push_back(
        ComputeRawLogprobs(chunk_logits.subspan(static_cast<size_t>(i) * vocab_size_, vocab_size_),
                           request->prompt_token_ids[position + 1], top_n));
  }
}

absl::Status Scheduler::TakeArgmax(Sequence* seq, int32_t token_id) {
  KVMESH_RETURN_IF_ERROR(EnsureSampler(seq));  // its Append keeps the counts a later sample needs
  if (token_id == -1) return absl::InvalidArgumentError("no token has a finite logit after masking and penalties");
  if (token_id < 0 || token_id >= vocab_size_) {
    return absl::InternalError(absl::StrCat("the runner's argmax ", token_id, " is outside the vocabulary"));
  }
  SampleResult result;
  result.token_id = token_id;
  AppendOutputToken(seq, std::move(result));
  return absl::OkStatus();
}

void Scheduler::AppendOutputToken(Sequence* seq, SampleResult result) {
  RequestState* request = seq->request;
  const int32_t token = result.token_id;
  seq->sampler->Append(token);
  seq->token_ids.push_back(token);
  seq->pending_token_ids.push_back(token);
  if (request->sampling_params.logprobs >= 0) seq->pending_logprobs.push_back(std::move(result));
  if (request->prefill_only) return;  // the decode side applies the stop checks
  const StopDecision stop = request->stop_checker.Check(token, seq->num_output_tokens());
  if (stop.finished()) {
    seq->stop_token_id = stop.stop_token_id;
    FinishSequence(seq, ToCompletionFinishReason(stop.reason));
  }
}

void Scheduler::FinishSequence(Sequence* seq, CompletionFinishReason reason) {
  if (seq->finished()) return;
  if (kv_.HasRequest(seq->kv_id)) {
    // Cannot fail: the id is known.
    (void)FreeKv(seq);
  }
  if (seq->status == SequenceStatus::kRunning) RemoveFromRunning(seq);
  if (seq->status == SequenceStatus::kWaiting) {
    kv_.ReleaseLoadHold(seq->kv_id);  // it may have been waiting for a disk load
    RemoveFromWaiting(seq);
  }
  if (seq->status == SequenceStatus::kReceiving || seq->status == SequenceStatus::kPrefilled) RemoveFromParked(seq);
  seq->status = SequenceStatus::kFinished;
  seq->finish_reason = reason;
  seq->finish_pending = true;
  seq->num_computed_tokens = 0;
  seqs_.erase(seq->kv_id);
}

void Scheduler::EndRequest(RequestState* request, CompletionFinishReason reason) {
  for (const auto& seq : request->seqs) FinishSequence(seq.get(), reason);
}

RequestOutput Scheduler::TakeOutput(RequestState* request, const absl::Status& status) {
  RequestOutput out;
  out.request_id = request->request_id;
  out.num_prompt_tokens = request->num_prompt_tokens();
  out.num_cached_prompt_tokens = std::max(0, request->num_cached_prompt_tokens);
  out.status = status;
  out.prefill_result = std::move(request->pending_prefill_result);
  if (request->sampling_params.prompt_logprobs >= 0 && !request->prompt_logprobs_reported &&
      !request->wants_prompt_logprobs()) {
    out.prompt_logprobs = std::move(request->prompt_logprobs);
    request->prompt_logprobs.clear();
    request->prompt_logprobs_reported = true;
  }
  request->pending_prefill_result.reset();
  for (const auto& seq : request->seqs) {
    if (seq->pending_token_ids.empty() && !seq->finish_pending) continue;
    CompletionOutput c;
    c.index = seq->sample_index;
    c.new_token_ids = std::move(seq->pending_token_ids);
    c.new_logprobs = std::move(seq->pending_logprobs);
    if (seq->finish_pending) {
      c.finish_reason = seq->finish_reason;
      c.stop_token_id = seq->stop_token_id;
    }
    seq->pending_token_ids.clear();
    seq->pending_logprobs.clear();
    seq->finish_pending = false;
    out.outputs.push_back(std::move(c));
  }
  out.finished = request->AllFinished();
  const auto now = std::chrono::steady_clock::now();
  if (request->times.first_token == std::chrono::steady_clock::time_point{} &&
      std::any_of(out.outputs.begin(), out.outputs.end(), [](const CompletionOutput& c) { return !c.new_token_ids.empty(); })) {
    request->times.first_token = now;
  }
  if (out.finished) request->times.finished = now;
  out.times = request->times;
  if (out.finished && !request->forked && request->n > 1) {
    // Ended (abort / error) before the fork: the samples that never existed end too, so
    // the caller sees all n indices finish.
    for (int32_t index = 1; index < request->n; ++index) {
      CompletionOutput c;
      c.index = index;
      c.finish_reason = request->seqs[0]->finish_reason;
      out.outputs.push_back(std::move(c));
    }
  }
  if (out.finished) {
    ++stats_.num_finished_requests;
    requests_.erase(request->request_id);  // destroys `request`
  }
  return out;
}

absl::StatusOr<std::vector<RequestOutput>> Scheduler::UpdateFromOutput(const SchedulerOutput& scheduled,
                                                                      std::span<const float> logits,
                                                                      std::span<const int32_t> argmax_token_ids) {
  const size_t expected = static_cast<size_t>(scheduled.num_logits_rows) * static_cast<size_t>(vocab_size_);
  if (logits.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("UpdateFromOutput: ", logits.size(), " logits for ",
                                                   scheduled.num_logits_rows, " rows of vocab_size ", vocab_size_));
  }
  if (argmax_token_ids.size() != static_cast<size_t>(scheduled.num_argmax_rows)) {
    return absl::InvalidArgumentError(absl::StrCat("UpdateFromOutput: ", argmax_token_ids.size(),
                                                   " argmax tokens for ", scheduled.num_argmax_rows, " rows"));
  }
  size_t argmax_row = 0;
  std::vector<RequestState*> touched;  // in batch order, each once
  absl::flat_hash_map<RequestState*, absl::Status> failed;
  size_t row = 0;
  for (const ScheduledChunk& chunk : scheduled.chunks) {
    std::span<const float> row_logits, chunk_logits;
    int32_t argmax_token = -1;
    if (chunk.argmax_only) {
      argmax_token = argmax_token_ids[argmax_row++];
    } else if (chunk.all_logits) {
      chunk_logits = logits.subspan(row * vocab_size_, static_cast<size_t>(chunk.num_tokens) * vocab_size_);
      row += static_cast<size_t>(chunk.num_tokens);
      if (chunk.compute_logits) row_logits = chunk_logits.subspan((chunk.num_tokens - 1) * vocab_size_, vocab_size_);
    } else if (chunk.compute_logits) {
      row_logits = logits.subspan(row++ * vocab_size_, vocab_size_);
    }
    const auto it = seqs_.find(chunk.kv_id);
    if (it == seqs_.end()) continue;  // ended since Schedule (Abort)
    Sequence* seq = it->second;
    if (seq->status != SequenceStatus::kRunning || seq->num_computed_tokens != chunk.start_position) continue;
    if (chunk.all_logits) CollectPromptLogprobs(seq->request, chunk.start_position, chunk_logits);
    const int32_t end = chunk.start_position + chunk.num_tokens;
    if (absl::Status s = kv_.MarkComputed(seq->kv_id, seq->token_ids, end, seq->request->cache_salt); !s.ok()) {
      return KvBroken(s, "MarkComputed");
    }
    const int32_t prefill = std::clamp(seq->num_prefill_tokens - chunk.start_position, 0, chunk.num_tokens);
    stats_.num_prefill_tokens += prefill;
    stats_.num_decode_tokens += chunk.num_tokens - prefill;
    seq->num_computed_tokens = end;
    if (!chunk.compute_logits) continue;

    RequestState* request = seq->request;
    if (std::find(touched.begin(), touched.end(), request) == touched.end()) touched.push_back(request);
    std::vector<Sequence*> samples = {seq};
    if (!request->forked) {
      if (request->n > 1) {
        KVMESH_RETURN_IF_ERROR(Fork(seq));
        for (size_t k = 1; k < request->seqs.size(); ++k) samples.push_back(request->seqs[k].get());
      }
      request->forked = true;
    }
    bool sampled = true;
    for (Sequence* sample : samples) {
      if (absl::Status s = chunk.argmax_only ? TakeArgmax(sample, argmax_token) : SampleNext(sample, row_logits);
          !s.ok()) {
        failed[request] = absl::Status(s.code(), absl::StrCat("sampling failed: ", s.message()));
        ++stats_.num_failed_requests;
        EndRequest(request, CompletionFinishReason::kError);
        sampled = false;
        break;
      }
    }
    if (sampled && request->prefill_only) HoldPrefilled(seq);
  }
  std::vector<RequestOutput> outputs;
  outputs.reserve(touched.size());
  for (RequestState* request : touched) {
    const auto f = failed.find(request);
    outputs.push_back(TakeOutput(request, f == failed.end() ? absl::OkStatus() : f->second));
  }
  return outputs;
}

absl::Status Scheduler::RetryScheduled(const SchedulerOutput& scheduled) {
  SchedulerOutput none;  // Preempt's bookkeeping for a step being built; this one is over
  int32_t budget = 0;
  for (const ScheduledChunk& chunk : scheduled.chunks) {
    const auto it = seqs_.find(chunk.kv_id);
    if (it == seqs_.end() || it->second->status != SequenceStatus::kRunning) continue;
    KVMESH_RETURN_IF_ERROR(Preempt(it->second, &none, &budget));
  }
  return absl::OkStatus();
}

std::vector<RequestOutput> Scheduler::FailScheduled(const SchedulerOutput& scheduled, const absl::Status& error) {
  std::vector<RequestState*> requests;
  for (const ScheduledChunk& chunk : scheduled.chunks) {
    const auto it = seqs_.find(chunk.kv_id);
    if (it == seqs_.end()) continue;
    RequestState* request = it->second->request;
    if (std::find(requests.begin(), requests.end(), request) == requests.end()) requests.push_back(request);
  }
  std::vector<RequestOutput> outputs;
  for (RequestState* request : requests) {
    EndRequest(request, CompletionFinishReason::kError);
    ++stats_.num_failed_requests;
    outputs.push_back(TakeOutput(request, error));
  }
  return outputs;
}

absl::StatusOr<RequestOutput> Scheduler::Abort(const std::string& request_id) {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("Abort: no unfinished request '", request_id, "'"));
  }
  RequestState* request = it->second.get();
  EndRequest(request, CompletionFinishReason::kAbort);
  ++stats_.num_aborted_requests;
  return TakeOutput(request, absl::OkStatus());
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = stats_;
  s.num_requests = static_cast<int32_t>(requests_.size());
  s.num_running_seqs = static_cast<int32_t>(running_.size());
  s.num_waiting_seqs = static_cast<int32_t>(waiting_.size());
  for (const Sequence* seq : parked_) {
    if (seq->status == SequenceStatus::kReceiving) ++s.num_receiving_seqs;
    if (seq->status == SequenceStatus::kPrefilled) ++s.num_prefilled_seqs;
  }
  return s;
}

absl::Status Scheduler::CheckInvariants() const {
  KVMESH_RETURN_IF_ERROR(kv_.CheckInvariants());
  absl::flat_hash_set<const Sequence*> queued;
  for (const Sequence* seq : running_) {
    if (!queued.insert(seq).second) return absl::InternalError("a sequence is queued twice");
    if (seq->status != SequenceStatus::kRunning) return absl::InternalError("a running sequence is not kRunning");
    if (!kv_.HasRequest(seq->kv_id)) {
      return absl::InternalError(absl::StrCat("running sequence ", seq->kv_id.value, " holds no KV table"));
    }
    if (kv_.num_computed_tokens(seq->kv_id) != seq->num_computed_tokens) {
      return absl::InternalError(absl::StrCat("sequence ", seq->kv_id.value, " computed ", seq->num_computed_tokens,
                                              " but the KV manager says ", kv_.num_computed_tokens(seq->kv_id)));
    }
    if (seq->num_computed_tokens >= seq->num_tokens()) {
      return absl::InternalError(absl::StrCat("running sequence ", seq->kv_id.value, " has no pending token"));
    }
  }
  for (const Sequence* seq : waiting_) {
    if (!queued.insert(seq).second) return absl::InternalError("a sequence is queued twice");
    if (seq->status != SequenceStatus::kWaiting) return absl::InternalError("a waiting sequence is not kWaiting");
    if (kv_.HasRequest(seq->kv_id) || seq->num_computed_tokens != 0) {
      return absl::InternalError(absl::StrCat("waiting sequence ", seq->kv_id.value, " holds KV"));
    }
  }
  for (const Sequence* seq : parked_) {
    if (!queued.insert(seq).second) return absl::InternalError("a sequence is queued twice");
    const bool receiving = seq->status == SequenceStatus::kReceiving;
    if (!receiving && seq->status != SequenceStatus::kPrefilled) {
      return absl::InternalError("a parked sequence is neither kReceiving nor kPrefilled");
    }
    if (!kv_.HasRequest(seq->kv_id) || kv_.num_computed_tokens(seq->kv_id) != seq->num_computed_tokens) {
      return absl::InternalError(absl::StrCat("parked sequence ", seq->kv_id.value, " lost its KV table"));
    }
    const int32_t prompt_len = seq->request->num_prompt_tokens();
    if (receiving && (seq->num_tokens() != prompt_len || seq->num_computed_tokens >= prompt_len ||
                      static_cast<int64_t>(kv_.block_table(seq->kv_id).size()) * kv_.block_size_tokens() <
                          prompt_len)) {
      return absl::InternalError(absl::StrCat("receiving sequence ", seq->kv_id.value, " does not cover its prompt"));
    }
    if (!receiving && (!seq->request->prefill_only || seq->num_computed_tokens != prompt_len ||
                       seq->num_tokens() != prompt_len + 1)) {
      return absl::InternalError(absl::StrCat("prefilled sequence ", seq->kv_id.value, " is inconsistent"));
    }
  }
  if (kv_.num_requests() != static_cast<int32_t>(running_.size() + parked_.size())) {
    return absl::InternalError(absl::StrCat("the KV manager has ", kv_.num_requests(), " tables for ",
                                            running_.size(), " running and ", parked_.size(),
                                            " parked sequences"));
  }
  if (seqs_.size() != queued.size()) {
    return absl::InternalError(absl::StrCat(seqs_.size(), " unfinished sequences but ", queued.size(), " queued"));
  }
  for (const auto& [id, request] : requests_) {
    if (request->AllFinished()) return absl::InternalError(absl::StrCat("finished request '", id, "' kept"));
    for (const auto& seq : request->seqs) {
      if (!seq->finished() && !queued.contains(seq.get())) {
        return absl::InternalError(absl::StrCat("request '", id, "' has an unqueued sequence"));
      }
    }
  }
  if (NumRunningSlots() > options_.max_num_seqs) {
    return absl::InternalError(absl::StrCat(NumRunningSlots(), " running sequence slots exceed max_num_seqs"));
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::engine
