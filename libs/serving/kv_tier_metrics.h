// The KV hierarchy's metrics (kvmesh_kv_tier_*{tier="host"|"disk"|"store"},
// kvmesh_kv_blocks_stranded and kvmesh_kv_blocks_quarantined), read from the engine's
// stats at scrape time.
//
// Thread-safety: registration is not thread-safe; the callbacks call `engine_stats`
// from the scraping thread (it must be thread-safe, as AsyncEngine::stats is).
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "metrics/registry.h"

namespace kvmesh::serving {

// Registers the tier gauges. The per-tier series read 0 on a worker without that tier.
absl::Status AddKvTierMetrics(metrics::Registry& registry, std::function<engine::EngineStats()> engine_stats);

}  // namespace kvmesh::serving
