#include "serving/kv_tier_metrics.h"

#include <string>
#include <utility>

#include "core/status_macros.h"
#include "kv/kv_types.h"

namespace kvmesh::serving {
namespace {

using Read = double (*)(const kv::KvTierStats&);

struct TierGauge {
  const char* name;
  const char* help;
  Read read;
};

// Counters are exposed as gauges "since start", like the engine's other counters here.
constexpr TierGauge kTierGauges[] = {
    {"kvmesh_kv_tier_queries", "Lookups of prefix blocks in the tier (since start).",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.queries); }},
    {"kvmesh_kv_tier_hits", "Lookups that found the block in the tier (since start).",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.hits); }},
    {"kvmesh_kv_tier_blocks_offloaded", "Blocks written into the tier (since start).",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.blocks_offloaded); }},
    {"kvmesh_kv_tier_bytes_offloaded", "Bytes written into the tier (since start).",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.bytes_offloaded); }},
    {"kvmesh_kv_tier_blocks_onboarded", "Blocks read back out of the tier (since start).",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.blocks_onboarded); }},
    {"kvmesh_kv_tier_bytes_onboarded", "Bytes read back out of the tier (since start).",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.bytes_onboarded); }},
    {"kvmesh_kv_tier_evictions", "Blocks the tier dropped to make room (since start).",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.evictions); }},
    {"kvmesh_kv_tier_checksum_failures", "Blocks whose bytes failed their checksum on the way up (recomputed).",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.checksum_failures); }},
    {"kvmesh_kv_tier_write_failures", "Offloads refused or failed: tier full of pinned blocks, queue full, disk full.",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.write_failures); }},
    {"kvmesh_kv_tier_read_failures",
     "Loads from the tier that failed other than by checksum: its peer dead, hung or restarted, the block gone "
     "(recomputed; the kv-store).",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.read_failures); }},
    {"kvmesh_kv_tier_skipped_records", "Disk records skipped at start-up: corrupt, truncated or another model's.",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.skipped_records); }},
    {"kvmesh_kv_tier_peer_restarts",
     "Restarts (a new epoch) of the tier's remote peers seen, each forgetting what they were believed to hold "
     "(the kv-store; since start).",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.peer_restarts); }},
    {"kvmesh_kv_tier_copies_in_flight", "Copies into or out of the tier in flight now.",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.in_flight); }},
    {"kvmesh_kv_tier_reads_in_flight", "Loads from the tier queued or running now (the kv-store).",
     [](const kv::KvTierStats& s) { return static_cast<double>(s.reads_in_flight); }},
    {"kvmesh_kv_tier_read_bytes_per_second", "Measured read (onboard) bandwidth of the tier.",
     [](const kv::KvTierStats& s) { return s.read_bytes_per_second; }},
    {"kvmesh_kv_tier_write_bytes_per_second", "Measured write (offload) bandwidth of the tier.",
     [](const kv::KvTierStats& s) { return s.write_bytes_per_second; }},
};

}  // namespace

absl::Status AddKvTierMetrics(metrics::Registry& registry, std::function<engine::EngineStats()> engine_stats) {
  for (const TierGauge& spec : kTierGauges) {
    KVMESH_ASSIGN_OR_RETURN(metrics::CallbackGaugeFamily * family,
                            registry.AddCallbackGaugeFamily(spec.name, spec.help, {"tier"}));
    for (const kv::Tier tier : {kv::Tier::kHost, kv::Tier::kDisk, kv::Tier::kStore}) {
      KVMESH_ASSIGN_OR_RETURN(metrics::CallbackGauge * g, family->WithLabels({std::string_view(kv::TierName(tier))}));
      g->SetCallback([engine_stats, read = spec.read, tier] {
        const engine::EngineStats s = engine_stats();
        return read(tier == kv::Tier::kHost ? s.host_tier : tier == kv::Tier::kDisk ? s.disk_tier : s.store_tier);
      });
    }
  }
  KVMESH_ASSIGN_OR_RETURN(metrics::CallbackGaugeFamily * decisions,
                          registry.AddCallbackGaugeFamily("kvmesh_kv_tier_decisions",
                                                          "Lower-tier prefix hits loaded or recomputed because "
                                                          "loading would have been slower (since start).",
                                                          {"decision"}));
  for (const bool load : {true, false}) {
    KVMESH_ASSIGN_OR_RETURN(metrics::CallbackGauge * g, decisions->WithLabels({std::string_view(load ? "load" : "recompute")}));
    g->SetCallback([engine_stats, load] {
      const engine::EngineStats s = engine_stats();
      return static_cast<double>(load ? s.tiers.load_decisions : s.tiers.recompute_decisions);
    });
  }
  KVMESH_RETURN_IF_ERROR(registry
                             .AddCallbackGauge("kvmesh_kv_tier_resident_blocks_host", "Blocks held by the host tier now.",
                                               [engine_stats] { return static_cast<double>(engine_stats().host_tier_resident); })
                             .status());
  KVMESH_RETURN_IF_ERROR(registry
                             .AddCallbackGauge("kvmesh_kv_tier_resident_blocks_disk", "Records held by the disk tier now.",
                                               [engine_stats] { return static_cast<double>(engine_stats().disk_tier_records); })
                             .status());
  KVMESH_RETURN_IF_ERROR(
      registry
          .AddCallbackGauge("kvmesh_kv_blocks_stranded",
                            "KV blocks held by no live request, or leased, pinned or quarantined past their deadline "
                            "(must be 0).",
                            [engine_stats] { return static_cast<double>(engine_stats().num_kv_blocks_stranded); })
          .status());
  KVMESH_RETURN_IF_ERROR(
      registry
          .AddCallbackGauge("kvmesh_kv_blocks_quarantined",
                            "KV blocks of failed transfers kept out of use while their sender may still write into "
                            "them (also counted as used).",
                            [engine_stats] { return static_cast<double>(engine_stats().num_kv_blocks_quarantined); })
          .status());
  return absl::OkStatus();
}

}  // namespace kvmesh::serving
