// Proto -> engine conversions (libs/rpc) on arbitrary wire bytes: a GenerateRequest /
// WorkerGenerateRequest's sampling parameters, a heartbeat's KV events, KV dtypes.
// Everything converts or is a clean error; what converts survives a round trip.
#include <string>

#include "engine/sampler.h"
#include "kvmesh/v1/api.pb.h"
#include "kvmesh/v1/scheduler.pb.h"
#include "kvmesh/v1/worker.pb.h"
#include "rpc/kv_conversions.h"
#include "rpc/sampling_conversions.h"

namespace {

void Sampling(const kvmesh::v1::SamplingParams& proto) {
  absl::StatusOr<kvmesh::engine::SamplingParams> params = kvmesh::rpc::SamplingParamsFromProto(proto);
  (void)kvmesh::rpc::NumSamplesFromProto(proto);
  if (!params.ok()) return;
  (void)params->Validate(/*vocab_size=*/32000, /*max_logprobs=*/20);
  kvmesh::v1::SamplingParams back;
  kvmesh::rpc::SamplingParamsToProto(*params, &back);
  if (!kvmesh::rpc::SamplingParamsFromProto(back).ok()) __builtin_trap();  // a converted value must convert back
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t kind = data[0] % 4;
  ++data;
  --size;
  const int n = static_cast<int>(size);
  switch (kind) {
    case 0: {
      kvmesh::v1::GenerateRequest r;
      if (r.ParseFromArray(data, n)) Sampling(r.sampling());
      break;
    }
    case 1: {
      kvmesh::v1::WorkerGenerateRequest r;
      if (r.ParseFromArray(data, n)) Sampling(r.sampling());
      break;
    }
    case 2: {
      kvmesh::v1::HeartbeatRequest r;
      if (!r.ParseFromArray(data, n)) break;
      for (const kvmesh::v1::KvEvent& e : r.kv_events()) {
        absl::StatusOr<kvmesh::kv::KvEvent> event = kvmesh::rpc::FromProto(e);
        if (!event.ok()) continue;
        kvmesh::v1::KvEvent back;
        kvmesh::rpc::ToProto(*event, &back);
        absl::StatusOr<kvmesh::kv::KvEvent> again = kvmesh::rpc::FromProto(back);
        if (!again.ok() || !(*again == *event)) __builtin_trap();
      }
      break;
    }
    default: {
      kvmesh::v1::RegisterRequest r;
      if (!r.ParseFromArray(data, n)) break;
      (void)kvmesh::rpc::KvDtypeFromProto(r.kv_cache_spec().dtype());
      break;
    }
  }
  return 0;
}
