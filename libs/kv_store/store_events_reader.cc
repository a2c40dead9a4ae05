#include "kv_store/store_events_reader.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/host_port.h"
#include "kv_store/kv_store_wire.h"
#include "kvmesh/v1/kv_store.grpc.pb.h"
#include "rpc/status_conversion.h"

namespace kvmesh::kv_store {

struct StoreEventsReader::Stub {
  std::unique_ptr<v1::KvStore::Stub> stub;
};

absl::StatusOr<std::unique_ptr<StoreEventsReader>> StoreEventsReader::Create(StoreEventsReaderOptions options) {
  if (absl::Status s = ParseHostPort(options.address).status(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("kv-store '", options.address, "': ", s.message()));
  }
  if (options.timeout_ms <= 0 || options.max_events < 1 || options.max_events > 65'536) {
    return absl::InvalidArgumentError(absl::StrCat("kv-store events reader: timeout_ms must be > 0 (got ",
                                                   options.timeout_ms, ") and max_events in [1, 65536] (got ",
                                                   options.max_events, ")"));
  }
  auto stub = std::make_unique<Stub>();
  stub->stub = v1::KvStore::NewStub(rpc::CreateChannel(options.address, options.channel));
  return std::unique_ptr<StoreEventsReader>(new StoreEventsReader(std::move(options), std::move(stub)));
}

StoreEventsReader::StoreEventsReader(StoreEventsReaderOptions options, std::unique_ptr<Stub> stub)
    : options_(std::move(options)), stub_(std::move(stub)) {}

StoreEventsReader::~StoreEventsReader() = default;

absl::StatusOr<StoreEventsPage> StoreEventsReader::Next() {
  v1::KvStoreEventsRequest request;
  request.set_epoch(cursor_.epoch);
  request.set_after_sequence(cursor_.after);
  request.set_snapshot_cursor(cursor_.snapshot_cursor);
  request.set_max_events(static_cast<int32_t>(options_.max_events));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(options_.timeout_ms));
  if (!options_.api_key.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", options_.api_key));
  v1::KvStoreEventsResponse response;
  if (absl::Status s = rpc::FromGrpcStatus(stub_->stub->Events(&context, request, &response)); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("kv-store ", options_.address, ": ", s.message()));
  }
  // Bounded by the request; a store that sends more is not believed.
  if (response.events_size() > request.max_events() || response.next_snapshot_cursor() < 0) {
    return absl::DataLossError(absl::StrCat("kv-store ", options_.address, ": malformed Events response"));
  }
  StoreEventsPage page{.epoch = response.epoch(),
                       .reset = response.reset(),
                       .next = {.epoch = response.epoch(),
                                .after = response.next_after_sequence(),
                                .snapshot_cursor = response.next_snapshot_cursor()}};
  page.events.reserve(static_cast<size_t>(response.events_size()));
  for (const v1::KvStoreEvent& event : response.events()) {
    page.events.push_back(StoreEvent{.key = FromProto(event.key()), .removed = event.removed()});
  }
  cursor_ = page.next;
  return page;
}

}  // namespace kvmesh::kv_store
