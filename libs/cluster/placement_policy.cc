#include "cluster/placement_policy.h"

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "kv/block_hash.h"

namespace kvmesh::cluster {
namespace {

struct Scored {
  const WorkerCandidate* candidate;
  WorkerScore score;
  int32_t pending;  // tie-break
};

// The best of `pool` per the header's rule; nullopt when empty.
std::optional<Scored> Best(const std::vector<Scored>& pool) {
  const bool any_ok = std::any_of(pool.begin(), pool.end(), [](const Scored& s) { return !s.score.overloaded; });
  std::optional<Scored> best;
  for (const Scored& s : pool) {
    if (any_ok && s.score.overloaded) continue;
    if (!best.has_value()) {
      best = s;
      continue;
    }
    // Candidates arrive ordered by worker id, so keeping the first of equals prefers the lower id.
    constexpr double kEpsilon = 1e-9;
    if (s.score.score > best->score.score + kEpsilon ||
        (s.score.score > best->score.score - kEpsilon && s.pending < best->pending)) {
      best = s;
    }
  }
  return best;
}

// The pick of `strategy` among `pool` (one role's candidates, in worker-id order).
std::optional<Scored> Pick(const std::vector<Scored>& pool, PlacementStrategy strategy,
                           std::atomic<uint64_t>& round_robin_next) {
  if (pool.empty()) return std::nullopt;
  switch (strategy) {
    case PlacementStrategy::kKvAware:
      return Best(pool);
    case PlacementStrategy::kRoundRobin:
      return pool[round_robin_next.fetch_add(1, std::memory_order_relaxed) % pool.size()];
    case PlacementStrategy::kLeastLoaded: {
      const Scored* least = &pool.front();
      for (const Scored& s : pool) {
        if (s.pending < least->pending || (s.pending == least->pending && s.score.kv_usage < least->score.kv_usage)) {
          least = &s;
        }
      }
      return *least;
    }
  }
  return Best(pool);
}

std::string Describe(const Scored& s) {
  const PrefixMatch& m = s.candidate->prefix;
  return absl::StrFormat("%s(score=%.3f cached=%d tiers=%d/%d/%d/%d in_flight=%d saved=%.2f%s pending=%.2f kv=%.2f%s)",
                         s.candidate->worker.registration.worker_id, s.score.score, s.score.cached_tokens,
                         m.num_blocks_by_tier[0], m.num_blocks_by_tier[1], m.num_blocks_by_tier[2],
                         m.num_blocks_by_tier[3],
                         m.num_blocks_in_flight,
                         s.score.cached_fraction, s.score.measured_tier_weights ? "" : " (tier weights unmeasured)",
                         s.score.pending_ratio, s.score.kv_usage, s.score.overloaded ? " overloaded" : "");
}

// Bytes of one full block of every layer, K and V, all TP ranks together.
int64_t KvBlockBytes(const KvCacheSpec& spec) {
  return int64_t{2} * spec.num_layers * spec.num_kv_heads * spec.block_size_tokens * spec.head_dim *
         DTypeSize(spec.dtype);
}

}  // namespace

PlacementPolicy::PlacementPolicy(const PlacementOptions& options) : options_(options) {}

double PlacementPolicy::TierBlockWeight(kv::Tier tier, const WorkerLoad& load, int64_t block_bytes,
                                        int32_t block_size_tokens, bool* measured) const {
  *measured = false;
  double bandwidth = 0.0, fallback = 1.0;
  switch (tier) {
    case kv::Tier::kDevice: *measured = true; return 1.0;
    case kv::Tier::kHost:
      bandwidth = load.kv_host_read_bytes_per_second;
      fallback = options_.host_tier_weight;
      break;
    case kv::Tier::kDisk:
      bandwidth = load.kv_disk_read_bytes_per_second;
      fallback = options_.disk_tier_weight;
      break;
    case kv::Tier::kStore:
      bandwidth = load.kv_store_read_bytes_per_second;
      fallback = options_.store_tier_weight;
      break;
  }
  if (bandwidth <= 0 || load.prefill_tokens_per_second <= 0 || block_bytes <= 0 || block_size_tokens <= 0) {
    return std::clamp(fallback, 0.0, 1.0);
  }
  *measured = true;
  const double load_seconds = static_cast<double>(block_bytes) / bandwidth;
  const double recompute_seconds = static_cast<double>(block_size_tokens) / load.prefill_tokens_per_second;
  return std::clamp(1.0 - load_seconds / recompute_seconds, 0.0, 1.0);
}

WorkerScore PlacementPolicy::Score(const WorkerCandidate& candidate, int32_t prompt_length_tokens,
                                   int32_t block_size_tokens) const {
  WorkerScore s;
  const PrefixMatch& m = candidate.prefix;
  const int64_t bs = std::max(block_size_tokens, 1);
  const int64_t prompt = std::max(prompt_length_tokens, 0);
  // In-flight blocks draw the request to the worker but are not cached yet: the
  // disaggregation rule and the reported cached tokens count only what is held.
  s.cached_tokens = static_cast<int32_t>(std::min<int64_t>((m.num_blocks - m.num_blocks_in_flight) * bs, prompt));
  s.in_flight_tokens = static_cast<int32_t>(std::min<int64_t>(m.num_blocks_in_flight * bs, prompt - s.cached_tokens));
  const WorkerSnapshot& w = candidate.worker;
  const int64_t block_bytes = KvBlockBytes(w.registration.kv_cache_spec);
  bool host_measured = false, disk_measured = false;
  s.host_block_weight = TierBlockWeight(kv::Tier::kHost, w.load, block_bytes, static_cast<int32_t>(bs), &host_measured);
  s.disk_block_weight = TierBlockWeight(kv::Tier::kDisk, w.load, block_bytes, static_cast<int32_t>(bs), &disk_measured);
  s.measured_tier_weights = host_measured && disk_measured;
  bool store_measured = false;
  s.store_block_weight =
      TierBlockWeight(kv::Tier::kStore, w.load, block_bytes, static_cast<int32_t>(bs), &store_measured);
  const int32_t device_blocks = m.num_blocks_by_tier[static_cast<int>(kv::Tier::kDevice)];
  const int32_t host_blocks = m.num_blocks_by_tier[static_cast<int>(kv::Tier::kHost)];
  const int32_t disk_blocks = m.num_blocks_by_tier[static_cast<int>(kv::Tier::kDisk)];
  const int32_t store_blocks = m.num_blocks_by_tier[static_cast<int>(kv::Tier::kStore)];
  if (prompt > 0) {
    // Blocks in flight will be on the device by the time this request's prefill reaches
    // them (or it computes them on the worker that caches them anyway): device weight.
    const double weighted_blocks = device_blocks + m.num_blocks_in_flight + s.host_block_weight * host_blocks +
                                   s.disk_block_weight * disk_blocks + s.store_block_weight * store_blocks;
    s.cached_fraction = std::clamp(weighted_blocks * static_cast<double>(bs) / static_cast<double>(prompt), 0.0, 1.0);
    if (w.load.prefill_tokens_per_second > 0) {
      // Saved share of the recompute time -> what is left of it.
      s.expected_prefill_seconds =
          (1.0 - s.cached_fraction) * static_cast<double>(prompt) / w.load.prefill_tokens_per_second;
    }
  }
  const int32_t max_seqs =
      w.registration.capacity.max_num_seqs > 0 ? w.registration.capacity.max_num_seqs : options_.default_max_num_seqs;
  s.pending_ratio = static_cast<double>(w.load.num_pending() + w.num_recent_placements) / std::max(max_seqs, 1);
  s.kv_usage = w.load.kv_usage();
  s.overloaded = s.kv_usage >= options_.overload_kv_usage || s.pending_ratio >= options_.overload_pending_ratio;
  s.score = options_.overlap_weight * s.cached_fraction - options_.queue_weight * s.pending_ratio -
            options_.kv_usage_weight * s.kv_usage;
  return s;
}

absl::StatusOr<Placement> PlacementPolicy::Choose(int32_t prompt_length_tokens, int32_t block_size_tokens,
                                                  std::span<const WorkerCandidate> candidates) const {
  std::vector<Scored> decode_pool;
  std::vector<Scored> prefill_pool;
  for (const WorkerCandidate& c : candidates) {
    Scored s{.candidate = &c,
             .score = Score(c, prompt_length_tokens, block_size_tokens),
             .pending = c.worker.load.num_pending() + c.worker.num_recent_placements};
    if (CanDecode(c.worker.registration.role)) decode_pool.push_back(s);
    if (CanPrefill(c.worker.registration.role)) prefill_pool.push_back(s);
  }
  // 1. The decode worker.
  const std::optional<Scored> decode = Pick(decode_pool, options_.strategy, round_robin_next_[0]);
  if (!decode.has_value()) {
    return absl::UnavailableError(absl::StrCat("no decode-capable worker among ", candidates.size(), " live workers"));
  }
  const WorkerRegistration& d = decode->candidate->worker.registration;
  Placement placement;
  placement.decode_worker_id = d.worker_id;
  placement.decode_address = d.address;
  placement.decode_cached_tokens = decode->score.cached_tokens;
  auto local = [&](std::string why) {
    placement.prefill_locally = true;
    placement.prefill_worker_id = d.worker_id;
    placement.prefill_address = d.address;
    placement.prefill_cached_tokens = decode->score.cached_tokens;
    placement.reason = absl::StrCat("decode=", Describe(*decode), "; prefill locally: ", why);
    return placement;
  };
  // 2. Conditional disaggregation.
  const int32_t uncached = std::max(prompt_length_tokens - decode->score.cached_tokens, 0);
  if (uncached < options_.disaggregation_threshold_tokens) {
    return local(absl::StrCat("uncached ", uncached, " tokens < threshold ", options_.disaggregation_threshold_tokens));
  }
  // 3. The prefill worker.
  const std::optional<Scored> prefill = Pick(prefill_pool, options_.strategy, round_robin_next_[1]);
  if (!prefill.has_value()) return local("no prefill-capable worker");
  const WorkerRegistration& p = prefill->candidate->worker.registration;
  if (p.worker_id == d.worker_id) return local("the best prefill worker is the decode worker");
  // 4. KV moves rank to rank (kv/transport/kv_rank_group.h): equal tensor-parallel sizes only.
  if (p.kv_cache_spec.tp_size != d.kv_cache_spec.tp_size) {
    return local(absl::StrCat("prefill worker ", p.worker_id, " has tensor-parallel size ", p.kv_cache_spec.tp_size,
                              " and decode worker ", d.worker_id, " ", d.kv_cache_spec.tp_size,
                              ": KV moves rank to rank"));
  }
  // 5. The pair's KV transport: UCX whenever both sides have it.
  if (p.kv_transports.ucx && d.kv_transports.ucx) {
    placement.kv_transport = KvTransportKind::kUcx;
  } else if (p.kv_transports.grpc_stream && d.kv_transports.grpc_stream) {
    placement.kv_transport = KvTransportKind::kGrpcStream;
  } else {
    return local(absl::StrCat("prefill worker ", p.worker_id, " and decode worker ", d.worker_id,
                              " share no KV transport"));
  }
  placement.prefill_worker_id = p.worker_id;
  placement.prefill_address = p.address;
  placement.prefill_cached_tokens = prefill->score.cached_tokens;
  placement.reason = absl::StrCat("prefill=", Describe(*prefill), "; decode=", Describe(*decode), "; kv=",
                                  placement.kv_transport == KvTransportKind::kUcx ? "ucx" : "grpc");
  return placement;
}

absl::StatusOr<PlacementStrategy> ParsePlacementStrategy(absl::string_view name) {
  if (name == "kv-aware") return PlacementStrategy::kKvAware;
  if (name == "round-robin") return PlacementStrategy::kRoundRobin;
  if (name == "least-loaded") return PlacementStrategy::kLeastLoaded;
  return absl::InvalidArgumentError(
      absl::StrCat("--placement-strategy must be kv-aware, round-robin or least-loaded, got '", name, "'"));
}

absl::StatusOr<Placement> PlacementPolicy::Place(const PlacementRequest& request, WorkerRegistry& registry) const {
  if (request.model.empty()) return absl::InvalidArgumentError("model: empty");
  const bool has_tokens = !request.prompt_token_ids.empty();
  const bool has_hashes = !request.prompt_block_hashes.empty();
  if (has_tokens && has_hashes) {
    return absl::InvalidArgumentError("give either prompt_token_ids or prompt_block_hashes, not both");
  }
  if (!has_tokens && request.prompt_length_tokens <= 0) {
    return absl::InvalidArgumentError("no prompt: prompt_token_ids empty and prompt_length_tokens <= 0");
  }
  KVMESH_ASSIGN_OR_RETURN(const KvCacheSpec spec, registry.ModelKvCacheSpec(request.model));
  std::vector<kv::BlockHash> computed;
  std::span<const kv::BlockHash> hashes = request.prompt_block_hashes;
  int32_t prompt_length = request.prompt_length_tokens;
  if (has_tokens) {
    computed = kv::HashFullBlocks(request.prompt_token_ids, spec.block_size_tokens, spec.block_hash_salt,
                                  request.cache_salt);
    hashes = computed;
    prompt_length = static_cast<int32_t>(request.prompt_token_ids.size());
  } else if (static_cast<int64_t>(hashes.size()) * spec.block_size_tokens > prompt_length) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_block_hashes: ", hashes.size(), " full blocks of ",
                                                   spec.block_size_tokens, " tokens exceed prompt_length_tokens ",
                                                   prompt_length));
  }
  const std::vector<WorkerCandidate> candidates =
      registry.Candidates(request.model, hashes, request.exclude_worker_ids);
  if (candidates.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no worker for model \"", request.model, "\" is accepting requests (all draining or excluded)"));
  }
  KVMESH_ASSIGN_OR_RETURN(Placement placement, Choose(prompt_length, spec.block_size_tokens, candidates));
  // The decode worker caches the prompt's blocks either way (computed or received), so a
  // prompt with the same prefix placed before they are reported should find them there.
  registry.NotePlacement(placement.decode_worker_id, hashes);
  if (!placement.prefill_locally) registry.NotePlacement(placement.prefill_worker_id, hashes);
  return placement;
}

}  // namespace kvmesh::cluster
