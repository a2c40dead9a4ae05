// PlacementPolicy: which prefill worker and which decode worker take a request.
//
// Each live, non-draining worker of the model gets a score:
//
//   score = overlap_weight  * cached_fraction      (share of the prompt's prefill time its
//                                                   cached blocks save, see below)
//         - queue_weight    * pending_ratio        ((waiting + queued + placed since its
//                                                   last heartbeat) / max_num_seqs)
//         - kv_usage_weight * kv_usage             (used / total KV blocks)
//
// and a worker is *overloaded* when kv_usage >= overload_kv_usage or pending_ratio >=
// overload_pending_ratio. The decision:
//   1. The decode worker is the best-scoring decode-capable worker that is not
//      overloaded (the best overall when all are). None: Unavailable.
//   2. Conditional disaggregation: if the prompt's part the decode worker has not cached
//      is shorter than disaggregation_threshold_tokens, it prefills locally (a transfer
//      would cost more than the compute).
//   3. Else the prefill worker is the best-scoring prefill-capable worker, chosen the
//      same way. None, or the decode worker itself: local prefill.
// Ties go to the worker with less pending work, then the lower worker id.
//
// A cached block's worth is its expected time to first token: a device-tier block is
// free; a host-, disk- or kv-store block costs block_bytes / that tier's read bandwidth,
// which saves only (1 - load time / recompute time) of recomputing its tokens at the
// worker's prefill speed, and nothing when loading is slower (the worker recomputes
// then). So device > host > disk > recompute follows from the bandwidths each worker
// reports in its heartbeat (WorkerLoad); a store block (cluster/store_residency.h: any
// worker with the store's key space can load it) thus weighs between a local host hit
// and recomputing by the store's measured bandwidth, and cached_fraction is the share of the
// prompt's recompute time the worker's cached prefix saves. Blocks in flight (placed on
// the worker moments ago, not reported yet: cluster/in_flight_prefixes.h) count as
// device blocks, so the requests of one prefix stick to one worker from the first on
// instead of landing on whichever looked idler before the first one's KV was reported.
// Before a worker has measured both its tier's bandwidth and its prefill speed, the
// constant host_tier_weight / disk_tier_weight stand in (NOTE: fallback only).
//
// The baselines (PlacementStrategy) replace only the choice among the candidates: round
// robin over the live workers of a role, or the least pending work; the conditional
// disaggregation rule is the same for all three. They exist to be measured against
// (tools/bench-placement), as llm-d and Dynamo compare their routers with them.
//
// Thread-safety: immutable after construction except the round-robin cursor (atomic);
// Place() is safe from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cluster/worker_registry.h"
#include "kv/kv_types.h"

namespace kvmesh::cluster {

enum class PlacementStrategy {
  kKvAware,      // the score above: prefix hits weighed by tier, load, KV usage
  kRoundRobin,   // the next live worker of the role, in worker-id order
  kLeastLoaded,  // the fewest pending requests (then KV usage, then worker id)
};
// "kv-aware", "round-robin", "least-loaded" (the scheduler's --placement-strategy).
absl::StatusOr<PlacementStrategy> ParsePlacementStrategy(absl::string_view name);

struct PlacementOptions {
  PlacementStrategy strategy = PlacementStrategy::kKvAware;
  double overlap_weight = 1.0;
  double queue_weight = 0.5;
  double kv_usage_weight = 0.5;
  // Fallback before measurements: a lower-tier block counts this much of a device hit.
  double host_tier_weight = 0.8;
  double disk_tier_weight = 0.5;
  double store_tier_weight = 0.4;  // a cluster kv-store block: over the network
  double overload_kv_usage = 0.95;
  double overload_pending_ratio = 1.0;
  // For workers that did not report max_num_seqs.
  int32_t default_max_num_seqs = 256;
  // Uncached prompt tokens below which the decode worker prefills itself. 0: always
  // disaggregate (when a prefill worker exists).
  int32_t disaggregation_threshold_tokens = 256;
};

struct PlacementRequest {
  std::string request_id;  // for the reason / logs
  std::string model;
  // Either the prompt's token ids (hashed with the model's KvCacheSpec) or its chained
  // full-block hashes plus prompt_length_tokens.
  std::vector<int32_t> prompt_token_ids;
  std::vector<kv::BlockHash> prompt_block_hashes;
  int32_t prompt_length_tokens = 0;
  std::vector<std::string> exclude_worker_ids;
  // The request's cache_salt, with prompt_token_ids: the workers' block hashes chain
  // from it (kv/block_hash.h), so the index matches only this salt's blocks.
  std::string cache_salt;
};

struct Placement {
  std::string prefill_worker_id;  // == decode_worker_id when prefill_locally
  // How the KV goes from the prefill to the decode worker (not prefill_locally): UCX
  // when both have it, else the gRPC stream.
  KvTransportKind kv_transport = KvTransportKind::kGrpcStream;
  std::string prefill_address;
  std::string decode_worker_id;
  std::string decode_address;
  bool prefill_locally = false;
  int32_t prefill_cached_tokens = 0;
  int32_t decode_cached_tokens = 0;
  std::string reason;
};

// One worker's score and its parts, for tests and the reason string.
struct WorkerScore {
  double score = 0.0;
  int32_t cached_tokens = 0;  // leading prompt tokens it holds on any tier
  // Tokens after those that a request placed on it moments ago is computing (PrefixMatch::
  // num_blocks_in_flight): they count in cached_fraction, not in cached_tokens.
  int32_t in_flight_tokens = 0;
  double cached_fraction = 0.0;  // share of the prefill time the cached prefix saves, in [0, 1]
  // Weight of one host / disk block relative to a device block: measured, or the fallback.
  double host_block_weight = 0.0;
  double disk_block_weight = 0.0;
  double store_block_weight = 0.0;
  bool measured_tier_weights = false;  // both weights came from the worker's measurements
  // Expected prefill seconds for the prompt given the cached prefix (onboarding
  // included); 0 when the worker has not measured its prefill speed.
  double expected_prefill_seconds = 0.0;
  double pending_ratio = 0.0;
  double kv_usage = 0.0;
  bool overloaded = false;
};

class PlacementPolicy {
 public:
  explicit PlacementPolicy(const PlacementOptions& options = {});

  // Hashes the prompt when needed, takes the candidates from `registry`, chooses and
  // records the placement as provisional load (WorkerRegistry::NotePlacement).
  // InvalidArgument: no model, no prompt, both token ids and hashes, or hashes longer
  // than prompt_length_tokens. Unavailable: no live, non-draining, non-excluded worker
  // of the model can decode.
  absl::StatusOr<Placement> Place(const PlacementRequest& request, WorkerRegistry& registry) const;

  // The decision of Place() over given candidates (pure). `block_size_tokens` converts
  // matched blocks to tokens.
  absl::StatusOr<Placement> Choose(int32_t prompt_length_tokens, int32_t block_size_tokens,
                                   std::span<const WorkerCandidate> candidates) const;

  WorkerScore Score(const WorkerCandidate& candidate, int32_t prompt_length_tokens,
                    int32_t block_size_tokens) const;

  // The worth of one block on `tier` relative to a device-tier block, in [0, 1], from
  // the worker's measured bandwidth and prefill speed (`block_bytes` per block of
  // `block_size_tokens`); the fallback weight when unmeasured (bandwidth, prefill
  // speed or block_bytes <= 0). `*measured` says which.
  double TierBlockWeight(kv::Tier tier, const WorkerLoad& load, int64_t block_bytes, int32_t block_size_tokens,
                         bool* measured) const;

  const PlacementOptions& options() const { return options_; }

 private:
  const PlacementOptions options_;
  mutable std::atomic<uint64_t> round_robin_next_[2] = {0, 0};  // per role: decode, prefill
};

}  // namespace kvmesh::cluster
