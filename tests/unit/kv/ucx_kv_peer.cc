// ucx_kv_peer: the other process of ucx_kv_transport_test's two-process cases — a KV
// receiver or sender with its own UcxKvTransport, driven over stdin/stdout, so that a
// test can stop (SIGSTOP), resume or kill (SIGKILL) one side of a transfer.
//
//   ucx_kv_peer receiver <tls> <num_blocks>
//     opens a lease over blocks [0, num_blocks) of its pool, prints "<descriptor hex>",
//     then waits for stdin to close.
//   ucx_kv_peer sender <tls> <stop_before_write>
//     reads a descriptor (hex) line, pushes every layer of its pool's blocks [0, n) into
//     it (each byte kPeerSenderByte), prints "open <code>" after OpenPush and
//     "done <code>" after the push's on_done (absl status codes), then waits for stdin
//     to close. With stop_before_write k > 0 it stops itself (SIGSTOP) just before its
//     k-th cross-memory-attach write, after the push's state was checked: a writer
//     descheduled inside its write loop.
//
// Both use ucx_kv_peer.h's pool shape.
#include "ucx_kv_peer.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "kv/transport/kv_lease_descriptor.h"
#include "kv/transport/ucx/cma_put.h"
#include "kv/transport/ucx/ucx_kv_transport.h"

namespace kvmesh::kv {
namespace {

UcxKvTransportOptions PeerOptions(const std::string& tls) {
  return {.tls = tls, .progress_timeout_ms = 300, .keepalive_interval_ms = 50, .receiver_timeout_ms = 300,
          .ack_timeout_ms = 500};
}

void WaitForStdinToClose() {
  std::string line;
  while (std::getline(std::cin, line)) {
  }
}

int Receiver(const std::string& tls, int32_t num_blocks) {
  auto storage = KvStorage::Create(PeerPoolShape()).value();
  auto transport = UcxKvTransport::Create(PeerOptions(tls)).value();
  const KvPoolHandle pool = transport->RegisterPool(storage->data(), storage->layout()).value();
  std::vector<BlockId> ids;
  for (int32_t i = 0; i < num_blocks; ++i) ids.push_back(BlockId{i});
  auto grant = transport->OpenLease(pool, {.block_ids = ids}, [](const absl::Status&, const KvTransferStats&) {});
  if (!grant.ok()) return 1;
  std::cout << absl::BytesToHexString(grant->descriptor) << std::endl;
  WaitForStdinToClose();
  return 0;
}

int Sender(const std::string& tls, int stop_before_write) {
  auto storage = KvStorage::Create(PeerPoolShape()).value();
  std::memset(storage->data(), kPeerSenderByte, static_cast<size_t>(storage->size_bytes()));
  UcxKvTransportOptions options = PeerOptions(tls);
  auto writes = std::make_shared<std::atomic<int>>(0);
  options.cma_write = [writes, stop_before_write](pid_t pid, const std::byte* local, size_t bytes, uint64_t remote) {
    if (writes->fetch_add(1) + 1 == stop_before_write) raise(SIGSTOP);
    return CmaWrite(pid, local, bytes, remote);
  };
  auto transport = UcxKvTransport::Create(options).value();
  const KvPoolHandle pool = transport->RegisterPool(storage->data(), storage->layout()).value();
  std::string hex;
  if (!std::getline(std::cin, hex)) return 1;
  const std::string descriptor = absl::HexStringToBytes(hex);
  auto push = transport->OpenPush(pool, descriptor);
  std::cout << "open " << static_cast<int>(push.status().code()) << std::endl;
  if (!push.ok()) {
    WaitForStdinToClose();
    return 0;
  }
  const int32_t n = static_cast<int32_t>(DecodeKvLeaseDescriptor(descriptor)->block_ids.size());
  std::vector<BlockId> src;
  for (int32_t i = 0; i < n; ++i) src.push_back(BlockId{i});
  for (int32_t layer = 0; layer < storage->layout().num_layers(); ++layer) {
    if (!(*push)->PutLayer(layer, 0, src).ok()) break;
  }
  std::promise<absl::Status> done;
  (*push)->Finish([&done](const absl::Status& s, const KvTransferStats&) { done.set_value(s); });
  std::cout << "done " << static_cast<int>(done.get_future().get().code()) << std::endl;
  WaitForStdinToClose();
  return 0;
}

}  // namespace
}  // namespace kvmesh::kv

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "receiver") {
    return kvmesh::kv::Receiver(argv[2], std::atoi(argv[3]));
  }
  if (argc == 4 && std::string(argv[1]) == "sender") return kvmesh::kv::Sender(argv[2], std::atoi(argv[3]));
  std::fprintf(stderr, "usage: ucx_kv_peer receiver <tls> <num_blocks> | sender <tls> <stop_before_write>\n");
  return 2;
}
