// UcxKvTransport: KvTransport over UCX (Debian's libucx 1.13: tcp, shm — posix/sysv —
// and cma; no CUDA transports, so device pools are staged through host memory by their
// owner). One ucp_context and one ucp_worker per transport (one per process, or per TP
// rank), progressed on the transport's own thread: the engine thread only checks and
// queues puts, it never posts a descriptor (a same-host receiver excepted: see
// cross_memory_attach, whose copies PutLayer makes itself, as the gRPC stream does).
//
// Data path: each pool is registered once (ucp_mem_map of its whole buffer) and a lease
// descriptor carries the pool's base address, block ids and packed rkey, plus this
// worker's address (and, for a receiver on the same host, its pid: see
// cross_memory_attach). The sender moves each merged run of a layer (source and
// destination blocks both consecutive) as ONE operation: on the same host one
// process_vm_writev straight into the receiver's pool; elsewhere one active message in
// rendezvous (kRun: lease, layer, lease indices) that the receiver checks against its
// lease (its sender, the range, contiguity, no repeats) and receives straight into the
// pool with ucp_am_recv_data_nbx (UCX moves it zero-copy: cma get, tcp zcopy sends,
// RDMA reads). Why not ucp_put_nbx: UCX 1.13 has no RMA lane for registered memory on
// tcp or shm and emulates puts with eager fragments (0.7-1.1 GB/s over tcp, 8-9 GB/s
// on shm, against 3.6 and 13-15 here; the rkey is still unpacked, so a bad one is
// refused at OpenPush). With checksum_runs every run's kv::Checksum (XXH3-64, read by
// PutLayer while the layer is in the cache) goes with it (kRun's header) or right
// after its direct write (Sums), and the receiver checks the landed bytes at once, on
// its thread, while later layers are still being computed: the completion waits only
// for the last layer's check. After its runs the sender sends the completion (an active
// message counting the (layer, block) pairs it moved and those it wrote directly); the
// receiver answers it once every run it counts has landed (over tcp a completion may
// overtake the last runs), checks the counts (and that every (layer, block) was
// verified) and reports the lease done.
//
// Control messages (active messages on the sender's endpoint; the receiver answers on
// the reply endpoint): Hello (opens the push: refused for an unknown lease), Progress
// (the sender's keepalive, every keepalive_interval_ms while a push is open), Sums,
// Done, Abort (sender cancelled), Fenced (a failed push whose direct writes can no
// longer land); HelloAck, ProgressAck (the receiver's keepalive), DoneAck and Refused
// (lease unknown or failed: the sender stops) back.
//
// Faults, both directions symmetric and bounded:
//  - the receiver dies or stops: endpoints use UCP_ERR_HANDLING_MODE_PEER where UCX
//    allows it (tcp; not UCX_TLS=sm, whose posix/sysv active messages have no peer
//    failure handling), so UCX's endpoint error handler fails the push at once; where
//    it cannot tell, the missing ProgressAcks do after receiver_timeout_ms (or the
//    missing DoneAck after ack_timeout_ms). Either way the endpoint is closed (nothing
//    more is sent) and on_done reports Unavailable, so the caller unpins its source
//    blocks. Every UCX request comes back (num_outstanding_requests): runs travel only
//    on endpoints with peer-failure handling, which a forced close empties; a same-host
//    receiver written by cross-memory attach gets only control messages over shared
//    memory (UCX 1.13 neither force-closes such an endpoint nor cancels a send on it).
//    Where UCX_TLS leaves nothing but shared memory and cross-memory attach is off,
//    runs go there anyway, and a receiver that dies mid-run strands them in UCX;
//  - the sender dies or stops (SIGKILL, SIGSTOP): it stops sending Progress and its
//    lease fails after progress_timeout_ms.
// Shutting a transport down ends its leases (Cancelled) and pushes (Cancelled).
//
// NOTE: a run the receiver receives ends before its lease does: a lease that ends
// (failed, closed, expired) while runs still land reports on_done only after they have,
// so its blocks are never handed back while UCX writes into them. A write by cross-
// memory attach cannot be refused: a sender checks its push before each write and
// stops once it was refused, but one stopped between that check and its write lands
// it whenever it resumes. So such a lease's on_released waits until its writer said
// it writes no more (Done, Fenced) or its process is gone (ucx/writer_fence.h).
//
// Thread-safety: thread-safe. Callbacks run on the transport's thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kv/transport/kv_transport.h"

namespace kvmesh::kv {

struct UcxKvTransportOptions {
  // UCX_TLS for this context ("shm,cma", "tcp", ...); empty: the UCX_TLS environment
  // variable, else UCX's choice.
  std::string tls;
  // Receiver: a lease whose sender (after its Hello) was not heard from for this long
  // fails (DeadlineExceeded): how a dead or stopped sender is noticed.
  int64_t progress_timeout_ms = 1000;
  // Receiver: a lease with no Hello this long after OpenLease fails; 0: no limit (the
  // control plane's own deadline and the engine's lease timeout cover that wait).
  int64_t hello_timeout_ms = 0;
  // Sender: Progress messages this often while a push is open (the receiver answers
  // each with a ProgressAck).
  int64_t keepalive_interval_ms = 200;
  // Sender: a push whose receiver answered nothing (no HelloAck, ProgressAck, ...) for
  // this long fails (Unavailable) and its endpoint is closed: how a dead receiver
  // is noticed where UCX cannot tell (shared memory) and how a stopped one is.
  int64_t receiver_timeout_ms = 1000;
  // Sender: how long the HelloAck and the DoneAck may take (Unavailable past it).
  int64_t ack_timeout_ms = 2000;
  // A receiver on this host in this PID namespace is written by cross-memory attach
  // (process_vm_writev, ucx/cma_put.h) instead of ucp_put_nbx, when the TLS allow cma
  // (a kernel that refuses it fails that push, Aborted, and turns it off here),
  // on PutLayer's own thread (a copy at memory speed, which the transport thread would
  // make only once a core is free of the model's work) and without a flush:
  // Debian's UCX 1.13 emulates puts into registered memory over shared memory with
  // active messages. Both sides must allow it (the receiver offers it in its leases).
  bool cross_memory_attach = true;
  // Sender: the kv::Checksum (XXH3-64) of every run goes with it; receiver: they are
  // required, of every (layer, block), and checked against what landed as it lands
  // (DataLoss on a mismatch or a gap). Costs a read of the bytes on both sides: the
  // sender's in PutLayer, the receiver's on its transport thread, overlapping the
  // next layers (kv_transport_bench --checksum-runs 0|1 measures it).
  bool checksum_runs = true;
  // How a same-host run is written: ucx/cma_put.h's CmaWrite when empty. A seam for
  // tests, which stop or corrupt a write here; called on PutLayer's thread.
  std::function<absl::Status(pid_t pid, const std::byte* local, size_t bytes, uint64_t remote)> cma_write;
};

class UcxKvTransport : public KvTransport {
 public:
  // Internal when UCX cannot be initialised (e.g. no transport of `tls` is usable).
  static absl::StatusOr<std::unique_ptr<UcxKvTransport>> Create(const UcxKvTransportOptions& options);
  ~UcxKvTransport() override;

  std::string_view name() const override { return "ucx"; }
  absl::StatusOr<KvPoolHandle> RegisterPool(std::byte* base, const KvLayout& layout) override;
  absl::StatusOr<KvLeaseGrant> OpenLease(KvPoolHandle pool, KvLeaseOptions options, KvLeaseDoneFn on_done) override;
  void CloseLease(uint64_t lease_token, absl::Status status) override;
  absl::StatusOr<std::unique_ptr<KvPush>> OpenPush(KvPoolHandle pool, std::string_view descriptor) override;

  // Leases still open here (receiver) and pushes not yet done (sender): what a stranded
  // -blocks gauge reads.
  int64_t num_open_leases() const;
  int64_t num_open_pushes() const;
  // Receiver: leases that ended while their sender, writing by cross-memory attach, may
  // still write: their on_released waits for it (ucx/writer_fence.h).
  int64_t num_fenced_leases() const;
  // UCX requests this transport posted and has not yet returned to UCX
  // (ucp_request_free): 0 once nothing is in flight, whatever became of the peers.
  int64_t num_outstanding_requests() const;
  // The UCX transports ("tl/device", e.g. "posix/memory", "tcp/eth0") of the lanes of
  // this sender's endpoints to its receivers, one entry per lane: where the KV goes.
  std::vector<std::string> peer_transports() const;

  class Impl;

 private:
  explicit UcxKvTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh::kv
