// The engine flags `serve` and `bench throughput` share (KV pool, block size,
// scheduler budget) and building the paged runner and Engine options from them.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "engine/paged_model_runner.h"

namespace kvmesh::cli {

// The file name fragment whose flags --help lists for commands that use these.
inline constexpr char kEngineFlagsFile[] = "engine_flags";

struct EngineFromFlags {
  std::unique_ptr<engine::PagedModelRunner> runner;
  engine::EngineOptions options;  // max_model_len: --max-model-len, else the model's context
};

// Sizes the KV pool from --kv-cache-bytes or --kv-cache-memory-fraction and fills the
// scheduler/KV options and max_model_len. InvalidArgument for out-of-range flags
// (e.g. --max-model-len beyond the model's max_position_embeddings).
absl::StatusOr<EngineFromFlags> BuildEngineFromFlags(engine::LlamaModel& model);

}  // namespace kvmesh::cli
