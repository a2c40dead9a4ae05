// KV push validation at the engine (Engine::ImportKvBlock and the commit after it),
// where every transport's payload lands: arbitrary transfer ids, layers, block
// indices, payload sizes and bytes, then a commit with an arbitrary first token.
// Everything is accepted or refused cleanly, the engine's invariants hold, and the
// engine ends with no block held.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "fake_kv_storage_runner.h"
#include "fuzz_util.h"

namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kBlockSize = 4;
constexpr int32_t kLayers = 2;

struct Harness {
  Harness() : runner(kVocab, kBlockSize, /*num_blocks=*/32, kLayers) {
    kvmesh::engine::EngineOptions o;
    o.kv.num_blocks = 32;
    o.kv.block_size_tokens = kBlockSize;
    o.max_model_len = 64;
    o.scheduler.max_num_seqs = 8;
    o.scheduler.max_num_batched_tokens = 256;
    engine = kvmesh::engine::Engine::Create(o, runner).value();
  }
  kvmesh::engine::testing::FakeKvStorageRunner runner;
  std::unique_ptr<kvmesh::engine::Engine> engine;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness h;
  static int64_t serial = 0;
  kvmesh::fuzz::Input in(data, size);
  kvmesh::engine::Engine& engine = *h.engine;

  kvmesh::engine::EngineRequest r;
  r.request_id = "fuzz-" + std::to_string(serial++);
  const int32_t prompt_len = 1 + in.Take<uint8_t>() % 40;
  for (int32_t i = 0; i < prompt_len; ++i) r.prompt_token_ids.push_back(1 + (i % (kVocab - 1)));
  r.sampling_params.max_tokens = 1 + in.Take<uint8_t>() % 8;
  r.sampling_params.temperature = 0;
  r.n = 1 + in.Take<uint8_t>() % 2;
  absl::StatusOr<kvmesh::engine::RemotePrefillLease> lease = engine.ReserveForRemotePrefill(std::move(r));
  if (!lease.ok()) return 0;
  const int64_t block_bytes = h.runner.kv_storage()->layout().BlockBytes();

  // Up to 16 imports: mostly aimed at the lease, sometimes at a wrong transfer.
  const int num_ops = in.Take<uint8_t>() % 17;
  for (int op = 0; op < num_ops && !in.empty(); ++op) {
    const uint8_t flags = in.Take<uint8_t>();
    kvmesh::engine::KvTransferId id = lease->transfer_id;
    if (flags & 1) id.value += in.Take<int8_t>();
    const int32_t layer = static_cast<int32_t>(in.Take<int8_t>()) % (kLayers + 2);
    const int32_t block = static_cast<int32_t>(in.Take<int8_t>()) % (static_cast<int32_t>(lease->block_ids.size()) + 2);
    int64_t bytes = block_bytes;
    if (flags & 2) bytes = in.Take<uint16_t>() % (2 * block_bytes + 1);
    std::vector<std::byte> payload(static_cast<size_t>(bytes));
    for (std::byte& b : payload) b = static_cast<std::byte>(in.Take<uint8_t>());
    (void)engine.ImportKvBlock(id, 0, layer, block, payload);
  }
  const int32_t first_token = static_cast<int32_t>(in.Take<int16_t>());
  absl::StatusOr<kvmesh::engine::RequestOutput> committed = engine.CommitRemotePrefill(lease->transfer_id, first_token);
  if (!committed.ok()) (void)engine.Abort(lease->request_id);
  // Run what was committed to its end (the fake runner checks every layer's KV), then
  // nothing may be left held.
  for (int step = 0; step < 64 && engine.HasUnfinishedRequests(); ++step) {
    absl::StatusOr<std::vector<kvmesh::engine::RequestOutput>> outs = engine.Step();
    if (!outs.ok()) break;  // the fake runner refusing garbage KV is a clean error
  }
  if (engine.HasUnfinishedRequests()) (void)engine.Abort(lease->request_id);
  for (int step = 0; step < 4 && engine.HasUnfinishedRequests(); ++step) (void)engine.Step();
  if (!engine.scheduler().CheckInvariants().ok()) __builtin_trap();
  if (!engine.HasUnfinishedRequests() && engine.kv_cache().num_used_blocks() != 0) __builtin_trap();
  return 0;
}
