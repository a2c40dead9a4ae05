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
  engine::EngineOptions options;  // max_model_len is the model's context unless overridden
};

// Sizes the KV pool from --kv-cache-bytes or --kv-cache-memory-fraction and fills the
// scheduler/KV options. InvalidArgument for out-of-range flags.
absl::StatusOr<EngineFromFlags> BuildEngineFromFlags(engine::LlamaModel& model);

}  // namespace kvmesh::cli
