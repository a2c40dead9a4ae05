// kv_transport_bench: moves the KV of a 4k-token prompt (256 blocks of 16 tokens, every
// layer) from a sender process to a receiver process
//   1. through UcxKvTransport (libs/kv/transport) with the options the worker uses
//      (on one host: cross-memory attach; "<tls>/am" rows: the rendezvous active
//      messages the transport uses elsewhere):
//      lease, OpenPush, one PutLayer per layer, Finish, the receiver's verdict — the
//      prefill -> decode path's whole transfer;
//   2. with `ucx_perftest -t ucp_put_bw` (ucx-utils) in client/server mode, same
//      UCX_TLS, message size = one layer's run (the size of our puts), and = the whole
//      transfer's bytes (the same DRAM traffic as ours): the bounds;
//   3. through the gRPC stream path (KvPushStream, services/prefill_worker, into a
//      PushKvBlocks receiver that checks XXH64 and copies into a pool as the decode
//      worker's does), on one host (loopback TCP);
// on shared memory (UCX_TLS=sm: posix/sysv active messages, cma puts) and on tcp
// between two network namespaces joined by a veth pair (root only; skipped, saying
// why, elsewhere), and prints GB/s with the ratios to their targets (>= 80% of
// ucx_perftest, >= 5x the gRPC stream on shm).
//
// Transfer tail: the same transfer with each PutLayer after a gap standing for that
// layer's compute (--layer-gap-us), timed from the last PutLayer (the last layer
// computed) to the receiver's commit (its lease's on_done), both on CLOCK_MONOTONIC;
// target <= 1 ms on shm.
//
// Shapes: the tiny test model's KV (8 layers, 2 KV heads, head_dim 64, f32) and a
// SmolLM2-135M-like one (30 layers, 3 KV heads, head_dim 64, bf16).
//
//   kv_transport_bench [--tls "sm;tcp-netns"] [--iters 20] [--layer-gap-us 500]
//                      [--perftest /usr/bin/ucx_perftest] [--checksum-runs 1]
// (--checksum-runs 0: runs without their XXH3 checksums, to measure what they cost.)
// (--tls: ';'-separated UCX_TLS values; "tcp-netns" is tcp across the namespaces.)
//
// The receiver is this binary re-executed with --receiver (a fresh process, no UCX
// state inherited through fork; under `ip netns exec` for tcp-netns).
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_split.h"
#include "kv/host_copy_bound.h"
#include "kv/kv_layout.h"
#include "kv/transport/ucx/same_host.h"
#include "kv/transport/ucx/ucx_kv_transport.h"
#include "kvmesh/v1/worker.grpc.pb.h"
#include "worker/kv_push_stream.h"
#include "rpc/channel.h"
#include "util/piped_child.h"
#include "bench/ucx_bench_util.h"


namespace kvmesh {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int32_t kPromptBlocks = 256;  // 4096 tokens
constexpr int32_t kDstFirst = 100;      // destination blocks [100, 356) of a 512-block pool

struct Shape {
  const char* name;
  kv::KvLayoutOptions layout;
};

std::vector<Shape> Shapes() {
  return {
      {"tiny (8L, 2 kv heads, d64, f32)",
       {.num_layers = 8, .num_kv_heads = 2, .head_dim = 64, .block_size_tokens = 16, .dtype = DType::kF32}},
      {"SmolLM2-135M-like (30L, 3 kv heads, d64, bf16)",
       {.num_layers = 30, .num_kv_heads = 3, .head_dim = 64, .block_size_tokens = 16, .dtype = DType::kBF16}},
  };
}

kv::KvLayoutOptions WithBlocks(kv::KvLayoutOptions o, int32_t n) {
  o.num_blocks = n;
  return o;
}

bool ReadAll(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
bool WriteAll(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Whether runs carry checksums (UcxKvTransportOptions::checksum_runs, both sides):
// --checksum-runs 1 (the worker's setting) or 0, for the cost of the check.
bool g_checksum_runs = true;

// What the worker's UcxKvTransport gets (libs/worker/worker.cc, with WorkerOptions
// defaults); `cma` false: same-host puts through ucp_put_nbx too, for comparison.
kv::UcxKvTransportOptions WorkerOptions(const std::string& tls, bool cma = true) {
  return {.tls = tls, .progress_timeout_ms = 1000, .receiver_timeout_ms = 1000, .cross_memory_attach = cma,
          .checksum_runs = g_checksum_runs};
}

using kvmesh::bench::CpuModel;
using kvmesh::bench::Median;

int64_t MonotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// ---- The receiver process: per 'o' on stdin, opens a lease over blocks [100, 356),
// writes its descriptor, then when the lease ends its status code and the
// CLOCK_MONOTONIC time (ns) of its on_done — the commit.
int RunReceiver(const std::string& tls, int shape_index, bool cma) {
  const Shape shape = Shapes()[shape_index];
  auto storage = kv::KvStorage::Create(WithBlocks(shape.layout, 512));
  kv::UcxKvTransportOptions options = WorkerOptions(tls, cma);
  options.hello_timeout_ms = 5000;  // a refused push must not leave the receiver waiting for ever
  auto transport = kv::UcxKvTransport::Create(options);
  if (!storage.ok() || !transport.ok()) {
    std::fprintf(stderr, "receiver: %s\n", transport.ok() ? storage.status().ToString().c_str()
                                                           : transport.status().ToString().c_str());
    return 1;
  }
  auto pool = (*transport)->RegisterPool((*storage)->data(), (*storage)->layout());
  if (!pool.ok()) return 1;
  std::vector<kv::BlockId> ids;
  for (int32_t i = 0; i < kPromptBlocks; ++i) ids.push_back(kv::BlockId{kDstFirst + i});
  char cmd = 0;
  while (ReadAll(0, &cmd, 1) && cmd == 'o') {
    std::promise<std::pair<absl::Status, int64_t>> done;
    auto grant = (*transport)->OpenLease(*pool, {.block_ids = ids}, [&](const absl::Status& s, const kv::KvTransferStats&) {
      done.set_value({s, MonotonicNs()});
    });
    if (!grant.ok()) return 1;
    const uint32_t n = static_cast<uint32_t>(grant->descriptor.size());
    if (!WriteAll(1, &n, 4) || !WriteAll(1, grant->descriptor.data(), n)) return 1;
    const auto [status, at_ns] = done.get_future().get();
    const int32_t code = static_cast<int32_t>(status.code());
    if (!WriteAll(1, &code, 4) || !WriteAll(1, &at_ns, 8)) return 1;
  }
  return 0;
}

using Child = testing::PipedChild;

// `prefix` runs before the binary (e.g. {"ip", "netns", "exec", NS}); `env` adds to the
// environment.
Child Spawn(const std::vector<std::string>& prefix, const std::vector<std::string>& args,
            const std::vector<std::string>& env_extra) {
  std::vector<std::string> all = prefix;
  all.insert(all.end(), args.begin(), args.end());
  return testing::SpawnPiped(std::move(all), env_extra);
}

void StopReceiver(Child& c) {
  const char q = 'q';
  (void)WriteAll(c.to, &q, 1);
  close(c.to);
  close(c.from);
  int status = 0;
  waitpid(c.pid, &status, 0);
}

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("/proc/self/exe");
}

// Where a run happens: one host (shared memory, loopback), or tcp from the root
// namespace to a receiver in kNetns over the veth pair.
constexpr char kNetns[] = "kvmesh-kvbench";
constexpr char kVethRoot[] = "kvbench0";
constexpr char kVethNs[] = "kvbench1";
constexpr char kRootIp[] = "10.213.7.1";
constexpr char kNsIp[] = "10.213.7.2";

struct Site {
  std::string label;  // what the table prints
  std::string tls;    // UCX_TLS
  bool netns = false;
  bool cma = true;    // UcxKvTransportOptions::cross_memory_attach, both sides
  // The bound's ucx_perftest test. NOTE: over tcp, ucp_put_bw stalls in UCX 1.13 (its
  // put is emulated with active messages that the idle target never progresses:
  // 0.03-0.7 GB/s), so the bound there is ucp_am_bw, what UCX moves over the link.
  std::string perftest_test = "ucp_put_bw";
};

constexpr kvmesh::bench::VethNetns kVeth{kNetns, kVethRoot, kVethNs, kRootIp, kNsIp};

void DropNetns() { kvmesh::bench::DropNetns(kVeth); }

// The two namespaces; an empty string when they are up, else why not.
std::string MakeNetns() { return kvmesh::bench::MakeNetns(kVeth); }

struct Result {
  double median_gbps = 0;
  double median_tail_ms = 0;
  double p90_tail_ms = 0;
  int64_t descriptors = 0;
  int64_t runs = 0;
  int failures = 0;
};

double P90(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, v.size() * 9 / 10)];
}

void SpinFor(std::chrono::microseconds d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
  }
}

// `iters` back-to-back transfers (bandwidth), then `iters` with a compute gap before
// each PutLayer (the tail).
Result BenchUcx(const Site& site, int shape_index, int iters, int64_t layer_gap_us) {
  const Shape shape = Shapes()[shape_index];
  auto storage = kv::KvStorage::Create(WithBlocks(shape.layout, kPromptBlocks)).value();
  for (int64_t i = 0; i < storage->size_bytes(); ++i) storage->data()[i] = static_cast<std::byte>(i * 131 + 7);
  std::vector<std::string> child_env;
  std::vector<std::string> prefix;
  if (site.netns) {
    // Each side sees only its end of the veth pair.
    setenv("UCX_NET_DEVICES", kVethRoot, 1);
    child_env.push_back(std::string("UCX_NET_DEVICES=") + kVethNs);
    prefix = {"ip", "netns", "exec", kNetns};
  }
  auto transport = kv::UcxKvTransport::Create(WorkerOptions(site.tls, site.cma)).value();
  if (site.netns) unsetenv("UCX_NET_DEVICES");
  const kv::KvPoolHandle pool = transport->RegisterPool(storage->data(), storage->layout()).value();
  std::vector<kv::BlockId> src;
  for (int32_t i = 0; i < kPromptBlocks; ++i) src.push_back(kv::BlockId{i});
  Child child = Spawn(prefix,
                      {SelfPath(), "--receiver", site.tls, std::to_string(shape_index), site.cma ? "cma" : "nocma",
                       g_checksum_runs ? "sums" : "nosums"},
                      child_env);
  Result result;
  std::vector<double> gbps, tails;
  const int32_t num_layers = storage->layout().num_layers();
  for (int it = 0; it < 2 * iters + 1; ++it) {  // the first is a warm-up (connection set-up)
    const bool tail_run = it > iters;
    const char o = 'o';
    uint32_t n = 0;
    if (!WriteAll(child.to, &o, 1) || !ReadAll(child.from, &n, 4)) break;
    std::string desc(n, '\0');
    if (!ReadAll(child.from, desc.data(), n)) break;
    const auto start = Clock::now();
    auto push = transport->OpenPush(pool, desc);
    if (!push.ok()) {
      std::fprintf(stderr, "OpenPush: %s\n", push.status().ToString().c_str());
      ++result.failures;
      break;
    }
    int64_t last_put_ns = 0;
    for (int32_t layer = 0; layer < num_layers; ++layer) {
      if (tail_run) SpinFor(std::chrono::microseconds(layer_gap_us));  // the layer's compute
      (void)(*push)->PutLayer(layer, 0, src);
      last_put_ns = MonotonicNs();
    }
    std::promise<std::pair<absl::Status, kv::KvTransferStats>> done;
    (*push)->Finish([&](const absl::Status& s, const kv::KvTransferStats& st) { done.set_value({s, st}); });
    const auto [status, stats] = done.get_future().get();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    int32_t code = -1;
    int64_t commit_ns = 0;
    (void)ReadAll(child.from, &code, 4);
    (void)ReadAll(child.from, &commit_ns, 8);
    if (!status.ok() || code != 0) {
      std::fprintf(stderr, "transfer: %s (receiver code %d)\n", status.ToString().c_str(), code);
      ++result.failures;
      continue;
    }
    result.descriptors = stats.descriptors;
    result.runs = stats.runs;
    if (it == 0) continue;
    if (tail_run) {
      tails.push_back(static_cast<double>(commit_ns - last_put_ns) / 1e6);
    } else {
      gbps.push_back(static_cast<double>(stats.bytes) / seconds / 1e9);
    }
  }
  StopReceiver(child);
  result.median_gbps = Median(gbps);
  result.median_tail_ms = Median(tails);
  result.p90_tail_ms = P90(tails);
  return result;
}

// ucx_perftest ucp_put_bw between two processes on the site's transport, `bytes` per
// put; GB/s (1e9).
double BenchPerftest(const std::string& perftest, const Site& site, int64_t bytes, int iters, int port) {
  return kvmesh::bench::UcxPerftestGbps(perftest, site.tls, site.netns ? &kVeth : nullptr, site.perftest_test, bytes,
                                        iters, port);
}

// ---- The gRPC stream path: a PushKvBlocks receiver as the decode worker's (XXH64 per
// chunk, copy into the pool), fed by the prefill worker's KvPushStream.
class PushReceiver : public grpc::ServerReadReactor<v1::KvBlockChunk> {
 public:
  PushReceiver(kv::KvStorage& pool, v1::KvPushAck* ack) : pool_(pool), ack_(ack) { StartRead(&chunk_); }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    const std::string& p = chunk_.payload();
    if (XXH64(p.data(), p.size(), 0) != chunk_.checksum_xxh64()) {
      return Finish(grpc::Status(grpc::StatusCode::DATA_LOSS, "checksum"));
    }
    const size_t bb = static_cast<size_t>(pool_.layout().BlockBytes());
    for (int i = 0; i < chunk_.block_ids_size(); ++i) {
      std::memcpy(pool_.BlockData(chunk_.layer(), kv::BlockId{chunk_.block_ids(i)}).data(), p.data() + i * bb, bb);
    }
    ack_->set_num_bytes(ack_->num_bytes() + static_cast<int64_t>(p.size()));
    StartRead(&chunk_);
  }
  void OnDone() override { delete this; }

 private:
  kv::KvStorage& pool_;
  v1::KvPushAck* ack_;
  v1::KvBlockChunk chunk_;
};

class PushService : public v1::Worker::CallbackService {
 public:
  explicit PushService(kv::KvStorage& pool) : pool_(pool) {}
  grpc::ServerReadReactor<v1::KvBlockChunk>* PushKvBlocks(grpc::CallbackServerContext*, v1::KvPushAck* ack) override {
    return new PushReceiver(pool_, ack);
  }

 private:
  kv::KvStorage& pool_;
};

double BenchGrpc(int shape_index, int iters) {
  const Shape shape = Shapes()[shape_index];
  auto src = kv::KvStorage::Create(WithBlocks(shape.layout, kPromptBlocks)).value();
  auto dst = kv::KvStorage::Create(WithBlocks(shape.layout, 512)).value();
  PushService service(*dst);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  auto channel = rpc::CreateChannel("127.0.0.1:" + std::to_string(port));
  const size_t bb = static_cast<size_t>(src->layout().BlockBytes());
  const size_t per_chunk = std::max<size_t>(1, (4u << 20) / bb);  // prefill_call.cc's kMaxChunkBytes
  std::vector<double> gbps;
  for (int it = 0; it < iters + 1; ++it) {
    std::promise<absl::Status> done;
    const auto start = Clock::now();
    auto stream = worker::KvPushStream::Start(channel, "t" + std::to_string(it), 0,
                                              [&](const absl::Status& s, const v1::KvPushAck&, int64_t) {
                                                done.set_value(s);
                                              })
                      .value();  // no OutgoingCalls: always opened
    int64_t bytes = 0;
    for (int32_t layer = 0; layer < src->layout().num_layers(); ++layer) {
      for (int32_t first = 0; first < kPromptBlocks; first += static_cast<int32_t>(per_chunk)) {
        const int32_t n = std::min<int32_t>(static_cast<int32_t>(per_chunk), kPromptBlocks - first);
        v1::KvBlockChunk chunk;  // built as PrefillJob::SendLayer does
        chunk.set_transfer_id("t");
        chunk.set_layer(layer);
        std::string* payload = chunk.mutable_payload();
        payload->reserve(n * bb);
        for (int32_t b = first; b < first + n; ++b) {
          chunk.add_block_ids(kDstFirst + b);
          const auto span = src->BlockData(layer, kv::BlockId{b});
          payload->append(reinterpret_cast<const char*>(span.data()), span.size());
        }
        bytes += static_cast<int64_t>(payload->size());
        stream->Write(std::move(chunk));
      }
    }
    stream->Close();
    const absl::Status s = done.get_future().get();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!s.ok()) {
      std::fprintf(stderr, "gRPC push: %s\n", s.ToString().c_str());
      return 0;
    }
    if (it > 0) gbps.push_back(static_cast<double>(bytes) / seconds / 1e9);
  }
  server->Shutdown();
  std::sort(gbps.begin(), gbps.end());
  return gbps.empty() ? 0 : gbps[gbps.size() / 2];
}

int Main(int argc, char** argv) {
  std::string tls_list = "sm;tcp-netns";
  std::string perftest = "ucx_perftest";
  int iters = 20;
  int64_t layer_gap_us = 500;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tls") tls_list = argv[i + 1];
    else if (flag == "--iters") iters = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--perftest") perftest = argv[i + 1];
    else if (flag == "--layer-gap-us") layer_gap_us = std::max(0, std::atoi(argv[i + 1]));
    else if (flag == "--checksum-runs") g_checksum_runs = std::atoi(argv[i + 1]) != 0;
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  std::vector<Site> sites;
  bool netns_up = false;
  for (const std::string& tls : std::vector<std::string>(absl::StrSplit(tls_list, ';', absl::SkipEmpty()))) {
    if (tls == "tcp-netns") {
      const std::string why = MakeNetns();
      if (!why.empty()) {
        std::printf("SKIP tcp between network namespaces: %s\n", why.c_str());
        continue;
      }
      netns_up = true;
      sites.push_back({.label = "tcp/netns", .tls = "tcp", .netns = true, .perftest_test = "ucp_am_bw"});
    } else {
      const bool has_tcp = tls.find("tcp") != std::string::npos;
      sites.push_back({.label = tls, .tls = tls, .perftest_test = has_tcp ? "ucp_am_bw" : "ucp_put_bw"});
      // The same transport without cross-memory attach: what UCX's own put does.
      if (kv::UcxTlsAllowsCma(tls)) {
        sites.push_back({.label = tls + "/am", .tls = tls, .cma = false, .perftest_test = sites.back().perftest_test});
      }
    }
  }
  std::printf("cpu: %s  isa: %s  checksum_runs: %d\n", CpuModel().c_str(),
              kvmesh::bench::CpuIsa(),
              g_checksum_runs ? 1 : 0);
  std::printf("KV of a 4096-token prompt (256 blocks x 16 tokens, every layer), sender -> receiver process\n");
  std::printf("%-48s %-9s %7s %9s %9s %7s %9s %7s %8s %7s %6s %6s %9s %9s %5s\n", "shape", "transport", "MB",
              "ucx GB/s", "perftest", "ratio", "pt@xfer", "ratio", "memcpy", "ratio", "desc", "runs", "tail ms",
              "tail p90", "fail");
  const std::vector<Shape> shapes = Shapes();
  // The same messages copied by memcpy through DRAM in this process: what a copy of
  // that size can do on this machine when neither side is in the cache.
  std::vector<double> memcpy_gbps;
  for (const Shape& shape : shapes) {
    const auto layout = kv::KvLayout::Create(WithBlocks(shape.layout, kPromptBlocks)).value();
    memcpy_gbps.push_back(kv::MeasureHostCopyBound(layout.LayerBytes()).bytes_per_second / 1e9);
  }
  int port = 14000 + static_cast<int>(getpid() % 1000);
  std::vector<std::pair<int, double>> ucx_shm;
  for (const Site& site : sites) {
    for (int s = 0; s < static_cast<int>(shapes.size()); ++s) {
      const auto layout = kv::KvLayout::Create(WithBlocks(shapes[s].layout, kPromptBlocks)).value();
      const Result r = BenchUcx(site, s, iters, layer_gap_us);
      const int64_t run_bytes = layout.LayerBytes();  // one put: a layer's 256 contiguous blocks
      const double bound = BenchPerftest(perftest, site, run_bytes, std::max(20, iters * layout.num_layers()), port++);
      // The same bytes per message as a whole transfer moves: perftest then streams
      // through DRAM as the transfer does (its run-sized buffer stays in the cache).
      const double xfer_bound = BenchPerftest(perftest, site, layout.TotalBytes(), std::max(10, iters), port++);
      const double copy = memcpy_gbps[static_cast<size_t>(s)];
      std::printf("%-48s %-9s %7.1f %9.2f %9.2f %6.0f%% %9.2f %6.0f%% %8.2f %6.0f%% %6lld %6lld %9.3f %9.3f %5d\n",
                  shapes[s].name, site.label.c_str(), static_cast<double>(layout.TotalBytes()) / 1e6, r.median_gbps,
                  bound, bound > 0 ? 100.0 * r.median_gbps / bound : 0.0, xfer_bound,
                  xfer_bound > 0 ? 100.0 * r.median_gbps / xfer_bound : 0.0, copy,
                  copy > 0 ? 100.0 * r.median_gbps / copy : 0.0, static_cast<long long>(r.descriptors),
                  static_cast<long long>(r.runs), r.median_tail_ms, r.p90_tail_ms, r.failures);
      std::fflush(stdout);
      if (!site.netns && ucx_shm.size() < shapes.size()) ucx_shm.push_back({s, r.median_gbps});
    }
  }
  if (netns_up) DropNetns();
  std::printf("\ngRPC stream path (KvPushStream -> PushKvBlocks, one host over loopback TCP, 4 MB chunks, XXH64):\n");
  for (int s = 0; s < static_cast<int>(shapes.size()); ++s) {
    const double g = BenchGrpc(s, std::max(3, iters / 4));
    double ucx = 0;
    for (const auto& [i, v] : ucx_shm) {
      if (i == s) ucx = v;
    }
    std::printf("%-48s grpc %8.2f GB/s   ucx %s / grpc: %.1fx (target >= 5x)\n", shapes[s].name, g,
                sites.empty() ? "-" : sites[0].label.c_str(), g > 0 ? ucx / g : 0.0);
  }
  std::printf("\nucx GB/s: median over %d transfers, each OpenPush (Hello round trip) -> one PutLayer per layer ->"
              " flush -> completion acknowledged (sm: process_vm_writev into the receiver, kv/transport/ucx/cma_put.h;"
              " sm/am and tcp: each run an active message in rendezvous, received straight into the pool).\n"
              "perftest: ucx_perftest -t ucp_put_bw (ucp_am_bw over tcp, where UCX 1.13's put_bw stalls), same"
              " UCX_TLS, message = one layer's run (its one buffer stays in the last-level cache); pt@xfer: message ="
              " the whole transfer's bytes (through DRAM, as the transfer). Target ucx >= 80%% of it.\n"
              "memcpy: kv::MeasureHostCopyBound, one layer's run per memcpy between buffers larger than the cache"
              " (what a copy of that message size does through DRAM; a perftest above it is reading its cache).\ntail: last PutLayer -> the receiver's commit, median and"
              " p90 over %d transfers with %lld us of compute before each layer; target <= 1 ms on shm.\n"
              "desc: puts posted per transfer (bound: layers x runs); runs: merged runs per layer.\n",
              iters, iters, static_cast<long long>(layer_gap_us));
  return 0;
}

}  // namespace
}  // namespace kvmesh

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "--receiver") {
    kvmesh::g_checksum_runs = argc < 6 || std::string(argv[5]) != "nosums";
    return kvmesh::RunReceiver(argv[2], std::atoi(argv[3]), argc < 5 || std::string(argv[4]) != "nocma");
  }
  return kvmesh::Main(argc, argv);
}
