// StoreEventsReader: follows one kv-store's residency (KvStore.Events) for whoever
// mirrors it — the scheduler's prefix index. It keeps the cursor (epoch, last change,
// snapshot position) and hands back each page in order; the mirror applies them
// (StoreEventsPage::reset: forget that store's keys first).
//
// Thread-safety: not thread-safe; one poller thread owns a reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kv_store/store_event_journal.h"
#include "rpc/channel.h"

namespace kvmesh::kv_store {

struct StoreEventsReaderOptions {
  std::string address;      // host:port
  std::string api_key;      // the store's --api_keys; empty: none
  rpc::ChannelOptions channel;
  int64_t timeout_ms = 1'000;  // one call
  size_t max_events = 16'384;  // one page
};

class StoreEventsReader {
 public:
  // InvalidArgument for a malformed address or a non-positive timeout or page.
  static absl::StatusOr<std::unique_ptr<StoreEventsReader>> Create(StoreEventsReaderOptions options);
  ~StoreEventsReader();

  // The next page after the cursor, which it then advances past; the store's error
  // (its address named) when the call fails, leaving the cursor where it was. A page
  // with next.snapshot_cursor > 0, or a full one, has more behind it.
  absl::StatusOr<StoreEventsPage> Next();
  // Starts over: the next page is a snapshot (after the mirror forgot the store).
  void Reset() { cursor_ = {}; }

  const std::string& address() const { return options_.address; }
  const StoreEventsCursor& cursor() const { return cursor_; }
  size_t max_events() const { return options_.max_events; }

 private:
  struct Stub;
  StoreEventsReader(StoreEventsReaderOptions options, std::unique_ptr<Stub> stub);

  const StoreEventsReaderOptions options_;
  std::unique_ptr<Stub> stub_;
  StoreEventsCursor cursor_;
};

}  // namespace kvmesh::kv_store
