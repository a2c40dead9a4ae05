#include "cluster_rpc/cluster_conversions.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rpc/kv_conversions.h"

namespace kvmesh::cluster_rpc {

absl::StatusOr<cluster::KvCacheSpec> KvCacheSpecFromProto(const v1::KvCacheSpec& proto) {
  cluster::KvCacheSpec spec;
  spec.block_size_tokens = proto.block_size_tokens();
  spec.num_layers = proto.num_layers();
  spec.num_kv_heads = proto.num_kv_heads();
  spec.head_dim = proto.head_dim();
  KVMESH_ASSIGN_OR_RETURN(spec.dtype, rpc::KvDtypeFromProto(proto.dtype()));
  spec.tp_size = proto.tp_size();
  spec.block_hash_salt = proto.block_hash_salt();
  KVMESH_RETURN_IF_ERROR(spec.Validate());
  return spec;
}

absl::Status KvCacheSpecToProto(const cluster::KvCacheSpec& spec, v1::KvCacheSpec* proto) {
  proto->set_block_size_tokens(spec.block_size_tokens);
  proto->set_num_layers(spec.num_layers);
  proto->set_num_kv_heads(spec.num_kv_heads);
  proto->set_head_dim(spec.head_dim);
  KVMESH_ASSIGN_OR_RETURN(const v1::KvDtype dtype, rpc::KvDtypeToProto(spec.dtype));
  proto->set_dtype(dtype);
  proto->set_tp_size(spec.tp_size);
  proto->set_block_hash_salt(spec.block_hash_salt);
  return absl::OkStatus();
}

cluster::WorkerLoad WorkerLoadFromProto(const v1::WorkerLoad& proto) {
  return cluster::WorkerLoad{.num_running_seqs = proto.num_running_seqs(),
                             .num_waiting_seqs = proto.num_waiting_seqs(),
                             .kv_blocks_total = proto.kv_blocks_total(),
                             .kv_blocks_used = proto.kv_blocks_used(),
                             .kv_blocks_free = proto.kv_blocks_free(),
                             .kv_blocks_cached = proto.kv_blocks_cached(),
                             .queue_depth = proto.queue_depth(),
                             .kv_host_read_bytes_per_second = proto.kv_host_read_bytes_per_second(),
                             .kv_disk_read_bytes_per_second = proto.kv_disk_read_bytes_per_second(),
                             .kv_store_read_bytes_per_second = proto.kv_store_read_bytes_per_second(),
                             .prefill_tokens_per_second = proto.prefill_tokens_per_second()};
}

void WorkerLoadToProto(const cluster::WorkerLoad& load, v1::WorkerLoad* proto) {
  proto->set_num_running_seqs(load.num_running_seqs);
  proto->set_num_waiting_seqs(load.num_waiting_seqs);
  proto->set_kv_blocks_total(load.kv_blocks_total);
  proto->set_kv_blocks_used(load.kv_blocks_used);
  proto->set_kv_blocks_free(load.kv_blocks_free);
  proto->set_kv_blocks_cached(load.kv_blocks_cached);
  proto->set_queue_depth(load.queue_depth);
  proto->set_kv_host_read_bytes_per_second(load.kv_host_read_bytes_per_second);
  proto->set_kv_disk_read_bytes_per_second(load.kv_disk_read_bytes_per_second);
  proto->set_kv_store_read_bytes_per_second(load.kv_store_read_bytes_per_second);
  proto->set_prefill_tokens_per_second(load.prefill_tokens_per_second);
}

absl::StatusOr<cluster::WorkerRole> WorkerRoleFromProto(v1::WorkerRole role) {
  switch (role) {
    case v1::WORKER_ROLE_PREFILL: return cluster::WorkerRole::kPrefill;
    case v1::WORKER_ROLE_DECODE: return cluster::WorkerRole::kDecode;
    case v1::WORKER_ROLE_BOTH: return cluster::WorkerRole::kBoth;
    default: break;
  }
  return absl::InvalidArgumentError(absl::StrCat("role: unspecified or unknown (", static_cast<int>(role), ")"));
}

v1::WorkerRole WorkerRoleToProto(cluster::WorkerRole role) {
  switch (role) {
    case cluster::WorkerRole::kPrefill: return v1::WORKER_ROLE_PREFILL;
    case cluster::WorkerRole::kDecode: return v1::WORKER_ROLE_DECODE;
    case cluster::WorkerRole::kBoth: return v1::WORKER_ROLE_BOTH;
  }
  return v1::WORKER_ROLE_UNSPECIFIED;
}

absl::StatusOr<cluster::WorkerRegistration> RegistrationFromProto(const v1::RegisterRequest& proto) {
  cluster::WorkerRegistration registration;
  registration.worker_id = proto.worker_id();
  registration.address = proto.address();
  KVMESH_ASSIGN_OR_RETURN(registration.role, WorkerRoleFromProto(proto.role()));
  registration.model = proto.model();
  if (!proto.has_kv_cache_spec()) return absl::InvalidArgumentError("kv_cache_spec: missing");
  KVMESH_ASSIGN_OR_RETURN(registration.kv_cache_spec, KvCacheSpecFromProto(proto.kv_cache_spec()));
  registration.capacity = cluster::WorkerCapacity{.max_num_seqs = proto.capacity().max_num_seqs(),
                                                  .max_num_batched_tokens = proto.capacity().max_num_batched_tokens(),
                                                  .max_model_len = proto.capacity().max_model_len()};
  if (proto.kv_transports_size() > 0) {
    registration.kv_transports = cluster::KvTransportSet{.grpc_stream = false, .ucx = false};
    for (const int t : proto.kv_transports()) {
      if (t == v1::KV_TRANSPORT_UCX) registration.kv_transports.ucx = true;
      if (t == v1::KV_TRANSPORT_GRPC_STREAM) registration.kv_transports.grpc_stream = true;
    }
  }
  // Bounded like any list from the wire: a worker has one kv-store connector per rank.
  constexpr int kMaxKeySpaces = 64;
  if (proto.kv_store_key_spaces_size() > kMaxKeySpaces) {
    return absl::InvalidArgumentError(absl::StrCat("kv_store_key_spaces: ", proto.kv_store_key_spaces_size(),
                                                   " entries; at most ", kMaxKeySpaces));
  }
  for (const v1::KvKeySpace& space : proto.kv_store_key_spaces()) {
    registration.kv_store_key_spaces.push_back({.low = space.low(), .high = space.high()});
  }
  KVMESH_RETURN_IF_ERROR(registration.Validate());
  return registration;
}

absl::StatusOr<cluster::HeartbeatReport> HeartbeatReportFromProto(const v1::HeartbeatRequest& proto) {
  cluster::HeartbeatReport report;
  report.load = WorkerLoadFromProto(proto.load());
  report.kv_events.reserve(proto.kv_events_size());
  for (int i = 0; i < proto.kv_events_size(); ++i) {
    auto event = rpc::FromProto(proto.kv_events(i));
    if (!event.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("kv_events[", i, "]: ", event.status().message()));
    }
    report.kv_events.push_back(*event);
  }
  report.kv_events_snapshot = proto.kv_events_snapshot();
  report.draining = proto.draining();
  return report;
}

cluster::PlacementRequest PlacementRequestFromProto(const v1::PlaceRequest& proto) {
  cluster::PlacementRequest request;
  request.request_id = proto.request_id();
  request.model = proto.model();
  request.prompt_token_ids.assign(proto.prompt_token_ids().begin(), proto.prompt_token_ids().end());
  request.prompt_block_hashes.reserve(proto.prompt_block_hashes_size());
  for (const v1::BlockHash& hash : proto.prompt_block_hashes()) request.prompt_block_hashes.push_back(rpc::FromProto(hash));
  request.prompt_length_tokens = proto.prompt_length_tokens();
  request.exclude_worker_ids.assign(proto.exclude_worker_ids().begin(), proto.exclude_worker_ids().end());
  request.cache_salt = proto.cache_salt();
  return request;
}

void PlacementToProto(const cluster::Placement& placement, v1::PlaceResponse* proto) {
  proto->mutable_prefill_worker()->set_worker_id(placement.prefill_worker_id);
  proto->mutable_prefill_worker()->set_address(placement.prefill_address);
  proto->mutable_decode_worker()->set_worker_id(placement.decode_worker_id);
  proto->mutable_decode_worker()->set_address(placement.decode_address);
  proto->set_prefill_locally(placement.prefill_locally);
  proto->set_prefill_cached_tokens(placement.prefill_cached_tokens);
  proto->set_decode_cached_tokens(placement.decode_cached_tokens);
  proto->set_reason(placement.reason);
  if (!placement.prefill_locally) {
    proto->set_kv_transport(placement.kv_transport == cluster::KvTransportKind::kUcx ? v1::KV_TRANSPORT_UCX
                                                                                    : v1::KV_TRANSPORT_GRPC_STREAM);
  }
}

void WorkerSnapshotToProto(const cluster::WorkerSnapshot& snapshot, v1::WorkerStatus* proto) {
  const cluster::WorkerRegistration& r = snapshot.registration;
  proto->set_worker_id(r.worker_id);
  proto->set_address(r.address);
  proto->set_role(WorkerRoleToProto(r.role));
  proto->set_model(r.model);
  // The spec was validated at registration, so its dtype converts.
  (void)KvCacheSpecToProto(r.kv_cache_spec, proto->mutable_kv_cache_spec());
  if (r.kv_transports.grpc_stream) proto->add_kv_transports(v1::KV_TRANSPORT_GRPC_STREAM);
  if (r.kv_transports.ucx) proto->add_kv_transports(v1::KV_TRANSPORT_UCX);
  proto->mutable_capacity()->set_max_num_seqs(r.capacity.max_num_seqs);
  proto->mutable_capacity()->set_max_num_batched_tokens(r.capacity.max_num_batched_tokens);
  proto->mutable_capacity()->set_max_model_len(r.capacity.max_model_len);
  WorkerLoadToProto(snapshot.load, proto->mutable_load());
  proto->set_registered_unix_ms(absl::ToUnixMillis(snapshot.registered_at));
  proto->set_last_heartbeat_unix_ms(absl::ToUnixMillis(snapshot.last_heartbeat_at));
  proto->set_draining(snapshot.draining);
  proto->set_num_indexed_blocks(snapshot.num_indexed_blocks);
}

}  // namespace kvmesh::cluster_rpc
