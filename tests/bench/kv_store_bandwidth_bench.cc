// kv_store_bandwidth_bench: the kv-store's data plane (--data_plane=ucx, libs/kv_store_server/
// kv_store_data_plane.h) against its bounds, in one run:
//   store put  KvStoreClient::Put of a batch of SmolLM2-135M blocks (30 layers x K,V x 3 KV
//              heads x 16 tokens x head_dim 64 x bf16 = 368640 bytes each) from a pool
//              registered with the client's UcxKvTransport: PutIntent (a lease), the
//              one-sided push, Put(in_place) with the store's checksum check of every block;
//   store get  Lookup, then KvStoreClient::Get of the batch into the pool: Get with the
//              client's lease, the store's push, the client's checksum check of every block
//              (timed: the Get call);
//   perftest   `ucx_perftest` between two processes, same UCX_TLS, message size = one block
//              (ucp_put_bw on shm; ucp_am_bw on tcp, where UCX 1.13's put_bw stalls, as
//              kv_transport_bench found);
//   memcpy     kv::MeasureHostCopyBound of one block per memcpy between buffers larger
//              than the cache, in this process;
//   grpc       the same put and get over the gRPC stream (a client without the data plane);
// medians over --reps repetitions, on shared memory (UCX_TLS=sm, the store on this host)
// and on tcp between two network namespaces joined by a veth pair (the store in its own
// namespace; root only, skipped saying why elsewhere). GB/s are 1e9 bytes per second.
//
//   kv_store_bandwidth_bench [--sites "sm;tcp-netns"] [--reps 11] [--batch 64] [--piece 16] [--cma-gets 0]
//                            [--grpc 1] [--perftest ucx_perftest|none]
// (--cma-gets 1: the store's --data_plane_cma_gets, gets written into the reader by cross-memory
// attach; 0, the store's default: pulled by the reader through UCX's rendezvous.)
//                            [--perftest ucx_perftest] [--store build/services/kv_store/kvmesh-kv-store]
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/ucx_bench_util.h"
#include "integration/smollm2_store_block.h"
#include "kv/checksum.h"
#include "kv/host_copy_bound.h"
#include "kv/transport/ucx/ucx_kv_transport.h"
#include "kv_store/kv_store_client.h"
#include "kv_store/store_data_plane.h"
#include "kv_store/store_key.h"

extern char** environ;

namespace kvmesh::kv_store {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kBlockBytes = kSmolLm2BlockBytes;
constexpr char kNetns[] = "kvmesh-storebench";
constexpr char kVethRoot[] = "kvsbench0";
constexpr char kVethNs[] = "kvsbench1";
constexpr char kRootIp[] = "10.213.9.1";
constexpr char kNsIp[] = "10.213.9.2";

constexpr bench::VethNetns kVeth{kNetns, kVethRoot, kVethNs, kRootIp, kNsIp};
using bench::Median;

struct Site {
  std::string label;
  std::string tls;
  bool netns = false;
  std::string perftest_test;
};

// The store as a child process (in the namespace for tcp-netns), killed at scope exit.
class StoreChild {
 public:
  StoreChild(const std::string& bin, const Site& site, int port, int64_t capacity_blocks, bool cma_gets) {
    std::vector<std::string> argv;
    if (site.netns) argv = {"ip", "netns", "exec", kNetns, "env", std::string("UCX_NET_DEVICES=") + kVethNs};
    argv.insert(argv.end(), {bin, absl::StrCat("--listen=", site.netns ? kNsIp : "127.0.0.1", ":", port),
                             absl::StrCat("--block_bytes=", kBlockBytes),
                             absl::StrCat("--capacity_blocks=", capacity_blocks), "--metrics_port=-1",
                             "--data_plane=ucx", "--data_plane_ucx_tls=" + site.tls, "--log_level=warning",
                             cma_gets ? "--data_plane_cma_gets" : "--nodata_plane_cma_gets"});
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, "/tmp/kv_store_bandwidth_bench.store.log",
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (posix_spawnp(&pid_, args[0], &actions, nullptr, args.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~StoreChild() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  bool ok() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

struct Figures {
  double put_gbps = 0;
  double get_gbps = 0;
  int64_t ucx_put_blocks = 0;
  int64_t ucx_get_blocks = 0;
  int64_t failures = 0;
};

// `reps` puts of `batch` fresh blocks, each followed by a lookup and a get of them.
Figures Run(const std::string& address, const KvStoreDataPlane& plane, std::byte* pool, int batch, int reps,
            uint64_t prompt_base) {
  auto client = KvStoreClient::Create({.addresses = {address}, .warmup_ms = 0, .data_plane = plane}).value();
  const StoreKeySpace space = StoreKeySpace::Create({.model = "smollm2-135m", .block_spec = kSmolLm2Block}).value();
  // The worker has every block's checksum already (its host tier keeps them).
  std::vector<std::span<const std::byte>> src;
  std::vector<std::span<std::byte>> dst;
  std::vector<uint64_t> sums;
  for (int i = 0; i < batch; ++i) {
    src.emplace_back(pool + i * kBlockBytes, kBlockBytes);
    dst.emplace_back(pool + (batch + i) * kBlockBytes, kBlockBytes);
    sums.push_back(kv::Checksum(src.back()));
  }
  // Wait for the store to serve.
  for (int i = 0; i < 100 && client->epoch(0) == 0; ++i) {
    const std::vector<kv::BlockHash> probe_chain = {{.low = 0, .high = 0}};
    KvStoreLookup probe = client->Lookup(space.Keys(probe_chain), absl::Now() + absl::Seconds(1));
    if (client->epoch(0) == 0) absl::SleepFor(absl::Milliseconds(100));
  }
  Figures f;
  std::vector<double> put, get;
  // The first two are a warm-up: connections, and the first touch of every store slot (the
  // store holds two batches, so later puts reuse slots, as a full store does).
  constexpr int kWarmup = 2;
  for (int rep = 0; rep < reps + kWarmup; ++rep) {
    std::vector<kv::BlockHash> chain;
    for (int i = 0; i < batch; ++i) chain.push_back({.low = static_cast<uint64_t>(i), .high = prompt_base + rep});
    const std::vector<StoreKey> keys = space.Keys(chain);
    auto t0 = Clock::now();
    const KvStorePutResult p = client->Put(keys, src, sums, absl::Now() + absl::Seconds(30));
    const double put_s = std::chrono::duration<double>(Clock::now() - t0).count();
    KvStoreLookup lookup = client->Lookup(keys, absl::Now() + absl::Seconds(30));
    t0 = Clock::now();
    const KvStoreGetResult g = lookup.num_present == batch
                                   ? client->Get(lookup, dst, absl::Now() + absl::Seconds(30))
                                   : KvStoreGetResult{.error = absl::NotFoundError("lookup")};
    const double get_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (p.num_committed != batch || g.num_loaded != batch) {
      std::fprintf(stderr, "rep %d: put %d/%d (%s), get %d/%d (%s)\n", rep, p.num_committed, batch,
                   p.error.ToString().c_str(), g.num_loaded, batch, g.error.ToString().c_str());
      ++f.failures;
      continue;
    }
    if (std::memcmp(pool, pool + batch * kBlockBytes, static_cast<size_t>(batch * kBlockBytes)) != 0) {
      std::fprintf(stderr, "rep %d: blocks differ after the round trip\n", rep);
      ++f.failures;
    }
    std::memset(pool + batch * kBlockBytes, 0, static_cast<size_t>(batch * kBlockBytes));
    if (rep < kWarmup) continue;
    put.push_back(static_cast<double>(batch * kBlockBytes) / put_s / 1e9);
    get.push_back(static_cast<double>(batch * kBlockBytes) / get_s / 1e9);
  }
  f.put_gbps = Median(put);
  f.get_gbps = Median(get);
  f.ucx_put_blocks = client->stats().ucx_put_blocks;
  f.ucx_get_blocks = client->stats().ucx_get_blocks;
  return f;
}

std::string DefaultStoreBin() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string self = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  const size_t at = self.rfind("/tests/bench/");
  return at == std::string::npos ? "kvmesh-kv-store" : self.substr(0, at) + "/services/kv_store/kvmesh-kv-store";
}

int Main(int argc, char** argv) {
  std::string sites_arg = "sm;tcp-netns";
  std::string perftest = "ucx_perftest";
  std::string store_bin = DefaultStoreBin();
  int reps = 11;
  int batch = 64;
  int piece = KvStoreDataPlane{}.max_blocks_per_transfer;
  // The store's --data_plane_cma_gets: off (its default) the reader pulls a get through
  // UCX's rendezvous; on, the store writes it into the reader's process.
  bool cma_gets = false;
  bool with_grpc = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--sites") sites_arg = argv[i + 1];
    else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
    else if (flag == "--batch") batch = std::atoi(argv[i + 1]);
    else if (flag == "--piece") piece = std::atoi(argv[i + 1]);
    else if (flag == "--cma-gets") cma_gets = std::atoi(argv[i + 1]) != 0;
    else if (flag == "--grpc") with_grpc = std::atoi(argv[i + 1]) != 0;
    else if (flag == "--perftest") perftest = argv[i + 1];
    else if (flag == "--store") store_bin = argv[i + 1];
  }
  std::vector<Site> sites;
  bool netns_up = false;
  for (absl::string_view s : absl::StrSplit(sites_arg, ';', absl::SkipEmpty())) {
    if (s == "tcp-netns") {
      const std::string why = bench::MakeNetns(kVeth);
      if (!why.empty()) {
        std::printf("tcp/netns: skipped (%s)\n", why.c_str());
        continue;
      }
      netns_up = true;
      sites.push_back({.label = "tcp/netns", .tls = "tcp", .netns = true, .perftest_test = "ucp_am_bw"});
    } else {
      sites.push_back({.label = std::string(s), .tls = std::string(s), .perftest_test = "ucp_put_bw"});
    }
  }
  std::printf("cpu: %s  isa: %s  block: %lld bytes (SmolLM2-135M: 30 layers x K,V x 3 KV heads x 16 tokens x "
              "head_dim 64 x bf16)  batch: %d blocks (%.1f MiB) in pieces of %d  cma gets: %d  reps: %d (median)\n",
              bench::CpuModel().c_str(), bench::CpuIsa(), static_cast<long long>(kBlockBytes), batch,
              static_cast<double>(batch * kBlockBytes) / (1 << 20), piece, cma_gets ? 1 : 0, reps);
  const double memcpy_gbps = kv::MeasureHostCopyBound(kBlockBytes).bytes_per_second / 1e9;
  const int64_t pool_blocks = 2 * batch;
  std::unique_ptr<std::byte, decltype(&std::free)> pool(
      static_cast<std::byte*>(std::aligned_alloc(1 << 21, pool_blocks * kBlockBytes)), &std::free);
  std::mt19937_64 rng(1);
  for (int64_t i = 0; i < pool_blocks * kBlockBytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(pool.get() + i, &v, 8);
  }
  // What each side's check of every block costs alone: XXH3 of the batch from DRAM (the
  // other half of the pool in between, so nothing is cached).
  std::vector<double> xxh3;
  for (int r = 0; r < 7; ++r) {
    const std::byte* base = pool.get() + (r % 2) * batch * kBlockBytes;
    const auto t0 = Clock::now();
    uint64_t sink = 0;
    for (int i = 0; i < batch; ++i) sink ^= kv::Checksum({base + i * kBlockBytes, static_cast<size_t>(kBlockBytes)});
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (sink != 1) xxh3.push_back(static_cast<double>(batch * kBlockBytes) / s / 1e9);
  }
  const double xxh3_gbps = Median(xxh3);
  // A copy and then a check of the same bytes, one after the other: the bound of a
  // transfer whose receiver verifies what landed before it counts.
  const double serial_gbps = 1 / (1 / memcpy_gbps + 1 / xxh3_gbps);
  std::printf("memcpy: %.2f GB/s  xxh3 (one core, from DRAM): %.2f GB/s  copy-then-check (serial): %.2f GB/s\n",
              memcpy_gbps, xxh3_gbps, serial_gbps);
  std::printf("%-10s %9s %9s %9s %9s %8s %8s %8s %8s %9s %6s %9s %9s\n", "site", "put GB/s", "get GB/s", "perftest",
              "pt@batch", "put/pt", "get/pt", "put/cpy", "get/cpy", "memcpy", "fails", "grpc put", "grpc get");
  int port = 51870;
  uint64_t prompt = 1;
  for (const Site& site : sites) {
    if (site.netns) setenv("UCX_NET_DEVICES", kVethRoot, 1);
    auto transport = kv::UcxKvTransport::Create({.tls = site.tls, .checksum_runs = false}).value();
    if (site.netns) unsetenv("UCX_NET_DEVICES");
    KvStoreDataPlane plane = RegisterDataPlane(*transport, pool.get(), kBlockBytes, pool_blocks).value();
    plane.max_blocks_per_transfer = piece;
    const std::string address = absl::StrCat(site.netns ? kNsIp : "127.0.0.1", ":", port);
    Figures ucx, grpc;
    {
      StoreChild store(store_bin, site, port, 2 * batch, cma_gets);
      ucx = Run(address, plane, pool.get(), batch, reps, prompt);
      prompt += 1000;
      if (with_grpc) grpc = Run(address, KvStoreDataPlane{}, pool.get(), batch, std::max(3, reps / 3), prompt);
      prompt += 1000;
    }
    ++port;
    const bench::VethNetns* netns = site.netns ? &kVeth : nullptr;
    const bool with_perftest = perftest != "none";
    const double pt = with_perftest ? bench::UcxPerftestGbps(perftest, site.tls, netns, site.perftest_test,
                                                             kBlockBytes, 2000, port++)
                                    : 0;
    // The same test with the batch's bytes per message: every byte from and to DRAM.
    const double pt_batch = with_perftest ? bench::UcxPerftestGbps(perftest, site.tls, netns, site.perftest_test,
                                                                   batch * kBlockBytes, 40, port++)
                                          : 0;
    std::printf("%-10s %9.2f %9.2f %9.2f %9.2f %7.0f%% %7.0f%% %7.0f%% %7.0f%% %9.2f %6lld %9.2f %9.2f\n",
                site.label.c_str(), ucx.put_gbps, ucx.get_gbps, pt, pt_batch,
                pt > 0 ? 100 * ucx.put_gbps / pt : 0, pt > 0 ? 100 * ucx.get_gbps / pt : 0,
                100 * ucx.put_gbps / memcpy_gbps, 100 * ucx.get_gbps / memcpy_gbps, memcpy_gbps,
                static_cast<long long>(ucx.failures + grpc.failures), grpc.put_gbps, grpc.get_gbps);
    std::printf("           (blocks over UCX: put %lld, get %lld; over the stream: put %lld, get %lld)\n",
                static_cast<long long>(ucx.ucx_put_blocks), static_cast<long long>(ucx.ucx_get_blocks),
                static_cast<long long>(grpc.ucx_put_blocks), static_cast<long long>(grpc.ucx_get_blocks));
  }
  if (netns_up) bench::DropNetns(kVeth);
  std::printf("put: Put() of the batch (PutIntent + UCX push + Put(in_place) + the store's XXH3 check of every block); "
              "get: Get() after a Lookup (Get + the store's push + the client's XXH3 check of every block)\n"
              "perftest: ucx_perftest -t ucp_put_bw (ucp_am_bw over tcp) -s %lld, same UCX_TLS (one buffer, "
              "cache-resident); pt@batch: the same with -s %lld (one batch per message); memcpy: "
              "kv::MeasureHostCopyBound, one block per memcpy, buffers larger than the cache\n",
              static_cast<long long>(kBlockBytes), static_cast<long long>(batch * kBlockBytes));
  return 0;
}

}  // namespace
}  // namespace kvmesh::kv_store

int main(int argc, char** argv) { return kvmesh::kv_store::Main(argc, argv); }
