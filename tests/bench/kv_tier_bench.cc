// kv_tier_bench: the lower KV tiers' bandwidth against the hardware they sit on, in one run.
//
//   disk: DiskKvTier write and read of a working set of SmolLM2-135M-shaped blocks
//         (30 layers x 3 kv heads x 16 tokens x 64 dims x bf16 x K,V = 368,640 bytes)
//         vs the same disk on a file of the same size: writes against sequential
//         O_DIRECT 4 MiB writes (`dd bs=4M oflag=direct`); reads against the read bound
//         `kvmesh bench multi-turn` uses too (kv/disk_read_bound.h: O_DIRECT io_uring
//         reads of one record at the tier's queue depth), and 4 MiB reads at depth 1
//         for reference. Target >= 70%.
//   host: the host tier's own path on the same blocks (KvStorage::SwapOut / SwapIn of
//         batches of scattered blocks, hashing what they copy; HostKvTier's XXH3-64
//         CommitStore / Verify; and, for onboard, a Verify pass before the copy) vs
//         memcpy of whole blocks between buffers larger than the cache
//         (kv/host_copy_bound.h), on one thread and on every core, each against the
//         bound on as many threads. Target >= 80%.
//
//   bursts (--read-burst N): the disk tier reopened (a fresh estimate), its records
//         read N at a time with --burst-gap-ms of idle between bursts, as a serving
//         worker's loads come: the tier's estimate (bytes per busy second) against the
//         bursts' own time (first submission to last completion, as the tier's reaper
//         stamped it) — they must agree, idle gaps excluded.
//
//   kv_tier_bench [--dir DIR] [--working-set-mib N] [--host-working-set-mib N] [--queue-depth N]
//                 [--read-burst N] [--burst-gap-ms G]
#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bench_timer.h"
#include "kv/disk_kv_tier.h"
#include "kv/block_hash.h"
#include "kv/checksum.h"
#include "kv/disk_read_bound.h"
#include "kv/host_copy_bound.h"
#include "kv/host_kv_tier.h"
#include "kv/kv_layout.h"

namespace {

using Clock = std::chrono::steady_clock;
using kvmesh::kv::BlockHash;
using kvmesh::kv::DiskKvTier;

constexpr int32_t kLayers = 30;
constexpr int64_t kBlockBytesPerLayer = 3 * 16 * 64 * 2 * 2;  // kv heads x tokens x dims x bf16 x (K,V)
constexpr int64_t kRecordPayloadBytes = kLayers * kBlockBytesPerLayer;  // 368,640
constexpr int64_t kSeqChunkBytes = 4 << 20;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
double Gbps(int64_t bytes, double s) { return static_cast<double>(bytes) / s / 1e9; }

struct Aligned {
  explicit Aligned(int64_t bytes) : p(static_cast<std::byte*>(std::aligned_alloc(4096, static_cast<size_t>(bytes)))) {}
  ~Aligned() { std::free(p); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  std::byte* p;
};

void Fill(std::byte* p, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// Sequential O_DIRECT write of `bytes` in 4 MiB synchronous I/Os: GB/s.
bool SequentialWriteBaseline(const std::string& path, int64_t bytes, double* write_gbps) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0) {
    std::perror("open O_DIRECT baseline file");
    return false;
  }
  Aligned buf(kSeqChunkBytes);
  Fill(buf.p, kSeqChunkBytes, 7);
  auto t0 = Clock::now();
  for (int64_t off = 0; off < bytes; off += kSeqChunkBytes) {
    if (::pwrite(fd, buf.p, kSeqChunkBytes, off) != kSeqChunkBytes) {
      std::perror("pwrite");
      return false;
    }
  }
  auto t1 = Clock::now();
  ::close(fd);
  ::unlink(path.c_str());
  *write_gbps = Gbps(bytes, Seconds(t0, t1));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/kvmesh-kv-tier-bench";
  int64_t working_set_mib = 1024, host_working_set_mib = 1024;
  int32_t queue_depth = 32;
  int32_t read_burst = 0, burst_gap_ms = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir") dir = argv[i + 1];
    else if (a == "--working-set-mib") working_set_mib = std::atoll(argv[i + 1]);
    else if (a == "--host-working-set-mib") host_working_set_mib = std::atoll(argv[i + 1]);
    else if (a == "--queue-depth") queue_depth = std::atoi(argv[i + 1]);
    else if (a == "--read-burst") read_burst = std::atoi(argv[i + 1]);
    else if (a == "--burst-gap-ms") burst_gap_ms = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  std::printf("cpu: %s  isa: %s\n", CpuModel().c_str(),
              __builtin_cpu_supports("avx512f") ? "AVX-512" : __builtin_cpu_supports("avx2") ? "AVX2" : "baseline");
  std::printf("block: %d layers x %lld bytes = %lld bytes (SmolLM2-135M shape, bf16)\n", kLayers,
              static_cast<long long>(kBlockBytesPerLayer), static_cast<long long>(kRecordPayloadBytes));

  // ---- disk ----
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const int64_t num_blocks = working_set_mib * (1 << 20) / kRecordPayloadBytes;
  const int64_t disk_bytes = num_blocks * kRecordPayloadBytes;
  double seq_write = 0;
  if (!SequentialWriteBaseline(dir + "/sequential.dat", disk_bytes / kSeqChunkBytes * kSeqChunkBytes, &seq_write)) {
    return 1;
  }
  // The read bound at the tier's own I/O size and depth, and dd's 4 MiB at depth 1.
  auto bound = kvmesh::kv::MeasureDiskReadBound(
      {.directory = dir, .file_bytes = disk_bytes, .io_bytes = kRecordPayloadBytes, .queue_depth = queue_depth});
  auto dd = kvmesh::kv::MeasureDiskReadBound(
      {.directory = dir, .file_bytes = disk_bytes, .io_bytes = kSeqChunkBytes, .queue_depth = 1});
  if (!bound.ok() || !dd.ok()) {
    std::fprintf(stderr, "%s\n", (!bound.ok() ? bound.status() : dd.status()).ToString().c_str());
    return 1;
  }
  const double seq_read = bound->bytes_per_second / 1e9;
  kvmesh::kv::DiskKvTierOptions options;
  options.directory = dir + "/tier";
  options.num_layers = kLayers;
  options.block_bytes = kBlockBytesPerLayer;
  options.record_payload_bytes = kRecordPayloadBytes;
  options.capacity_bytes = (num_blocks + 1) * kvmesh::kv::DiskRecordBytes(kRecordPayloadBytes);
  options.queue_depth = queue_depth;
  options.salt = 1;
  auto tier_or = DiskKvTier::Create(options);
  if (!tier_or.ok()) {
    std::fprintf(stderr, "%s\n", tier_or.status().ToString().c_str());
    return 1;
  }
  auto& tier = **tier_or;
  // A pool of buffers, each reused once its I/O completed.
  const int32_t pool = 2 * queue_depth;
  Aligned arena(pool * kRecordPayloadBytes);
  Fill(arena.p, pool * kRecordPayloadBytes, 11);
  std::vector<uint64_t> checksums(static_cast<size_t>(pool));
  for (int32_t b = 0; b < pool; ++b) checksums[b] = kvmesh::kv::Checksum({arena.p + b * kRecordPayloadBytes, static_cast<size_t>(kRecordPayloadBytes)});
  auto buffer = [&](int32_t b) { return std::span<std::byte>(arena.p + b * kRecordPayloadBytes, kRecordPayloadBytes); };

  std::vector<int32_t> free_buffers;
  std::vector<int32_t> buffer_of_ticket_lo;  // ticket -> buffer, tickets are small and dense
  auto run = [&](bool write) -> double {
    free_buffers.clear();
    for (int32_t b = pool - 1; b >= 0; --b) free_buffers.push_back(b);
    buffer_of_ticket_lo.assign(static_cast<size_t>(8 * num_blocks + 64), -1);
    int64_t next = 0, done = 0, failures = 0;
    const auto t0 = Clock::now();
    while (done < num_blocks) {
      // Writes may hold only part of the queue (a read always finds room): wait for that
      // room rather than retry into a refusal, which the tier counts as a write failure.
      while (next < num_blocks && !free_buffers.empty() &&
             (write ? tier.CanStartSave() : tier.num_in_flight() < queue_depth)) {
        const int32_t b = free_buffers.back();
        const BlockHash h{.low = static_cast<uint64_t>(next) + 1, .high = 42};
        auto t = write ? tier.StartSave(h, {}, buffer(b), checksums[b]) : tier.StartLoad(h, buffer(b));
        if (!t.ok()) break;
        free_buffers.pop_back();
        buffer_of_ticket_lo[static_cast<size_t>(*t)] = b;
        ++next;
      }
      for (const auto& c : tier.Poll()) {
        ++done;
        if (!c.status.ok()) ++failures;
        free_buffers.push_back(buffer_of_ticket_lo[static_cast<size_t>(c.ticket)]);
      }
    }
    const double s = Seconds(t0, Clock::now());
    if (failures > 0) std::printf("  %lld of %lld I/Os failed\n", static_cast<long long>(failures),
                                  static_cast<long long>(num_blocks));
    return s;
  };
  // Every read verifies its record's checksum inside the tier (that cost is measured).
  const double write_s = run(true);
  const double read_s = run(false);
  const double tier_write = Gbps(disk_bytes, write_s), tier_read = Gbps(disk_bytes, read_s);
  std::printf("disk (%s, %s, %lld blocks = %.2f GiB, queue depth %d):\n", dir.c_str(),
              tier.direct_io() ? "O_DIRECT" : "buffered", static_cast<long long>(num_blocks),
              static_cast<double>(disk_bytes) / (1 << 30), queue_depth);
  std::printf("  bound: write %.3f GB/s (sequential O_DIRECT 4 MiB)  read %.3f GB/s (O_DIRECT io_uring, %lld-byte "
              "reads at depth %d; %.3f GB/s in 4 MiB reads at depth 1)\n",
              seq_write, seq_read, static_cast<long long>(bound->io_bytes), bound->queue_depth,
              dd->bytes_per_second / 1e9);
  std::printf("  disk tier, wall clock:     write %.3f GB/s  read %.3f GB/s\n", tier_write, tier_read);
  std::printf("  disk tier, its estimate:   write %.3f GB/s  read %.3f GB/s  (bytes per busy second: what the "
              "tiers decide with and report)\n",
              tier.stats().write_bytes_per_second / 1e9, tier.stats().read_bytes_per_second / 1e9);
  const double best_read = std::max(seq_read, dd->bytes_per_second / 1e9);
  std::printf("  ratio to the bound:        write %.0f%%  read %.0f%% of the tier-pattern bound, %.0f%% of the best "
              "sequential read  (wall clock; target >= 70%%)\n",
              100 * tier_write / seq_write, 100 * tier_read / seq_read, 100 * tier_read / best_read);
  std::printf("  checksum failures %lld  write failures %lld\n", static_cast<long long>(tier.stats().checksum_failures),
              static_cast<long long>(tier.stats().write_failures));
  tier_or->reset();

  if (read_burst > 0) {
    auto again = DiskKvTier::Create(options);  // same directory: the records are recovered
    if (!again.ok()) {
      std::fprintf(stderr, "%s\n", again.status().ToString().c_str());
      return 1;
    }
    DiskKvTier& t = **again;
    const int32_t burst = std::min(read_burst, std::min(pool, queue_depth));
    double burst_seconds = 0;
    int64_t bytes = 0;
    for (int64_t first = 0; first + burst <= num_blocks; first += burst) {
      const auto submitted = Clock::now();
      Clock::time_point last{};
      int32_t done = 0;
      for (int32_t b = 0; b < burst; ++b) {
        const BlockHash h{.low = static_cast<uint64_t>(first + b) + 1, .high = 42};
        if (!t.StartLoad(h, buffer(b)).ok()) {
          std::fprintf(stderr, "burst read refused\n");
          return 1;
        }
      }
      while (done < burst) {
        for (const auto& c : t.Poll()) {
          ++done;
          last = std::max(last, c.completed_at);
        }
      }
      burst_seconds += Seconds(submitted, last);
      bytes += burst * kRecordPayloadBytes;
      std::this_thread::sleep_for(std::chrono::milliseconds(burst_gap_ms));
    }
    std::printf("  bursts of %d reads, %d ms apart: %.3f GB/s over the bursts' own time; tier's estimate %.3f GB/s\n",
                burst, burst_gap_ms, Gbps(bytes, burst_seconds), t.stats().read_bytes_per_second / 1e9);
  }
  std::filesystem::remove_all(dir);

  // ---- host ----
  // The tier's own path: a pool (KvStorage) and a HostKvTier of the same size, blocks
  // moved in batches of kHostBatch scattered blocks as a step moves them. Offload =
  // SwapOut hashing each layer slice as it copies it (kv/checksum.h) + CommitStore of
  // that checksum; onboard = Verify + SwapIn. Each beside its copy alone. The bound:
  // memcpy of whole blocks between buffers larger than the cache (kv/host_copy_bound.h),
  // on as many threads as the copies: once on one thread, once on every core (as a CPU
  // worker runs a step's copies on its backend's team, KvStorage::SwapOut).
  std::vector<int> thread_counts = {1};
  if (omp_get_num_procs() > 1) thread_counts.push_back(omp_get_num_procs());
  for (const int threads : thread_counts) {
    constexpr int32_t kHostBatch = 32;
    absl::StatusOr<std::unique_ptr<kvmesh::kv::KvStorage>> pool = kvmesh::kv::KvStorage::Create(
        {.num_layers = kLayers, .num_kv_heads = 3, .head_dim = 64, .block_size_tokens = 16,
         .dtype = kvmesh::DType::kBF16, .budget_bytes = host_working_set_mib << 20});
    if (!pool.ok()) {
      std::fprintf(stderr, "%s\n", std::string(pool.status().message()).c_str());
      return 1;
    }
    const int32_t blocks = (*pool)->layout().num_blocks();
    Fill((*pool)->data(), (*pool)->size_bytes(), 3);
    std::vector<int32_t> order(static_cast<size_t>(blocks));
    for (int32_t i = 0; i < blocks; ++i) order[static_cast<size_t>(i)] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937(11));
    const int64_t bytes = static_cast<int64_t>(blocks) * kRecordPayloadBytes;
    std::vector<double> out_s, sum_s, in_s, verify_s, fused_s;
    for (int rep = 0; rep < 7; ++rep) {
      // A fresh tier each pass: its slots are filled once (filling -> resident).
      absl::StatusOr<std::unique_ptr<kvmesh::kv::HostKvTier>> host = kvmesh::kv::HostKvTier::Create(
          {.capacity_bytes = bytes, .slot_bytes = kRecordPayloadBytes, .record_events = false});
      if (!host.ok()) {
        std::fprintf(stderr, "%s\n", std::string(host.status().message()).c_str());
        return 1;
      }
      std::vector<kvmesh::kv::HostSlot> slots;
      for (int32_t i = 0; i < blocks; ++i) {
        const BlockHash h = kvmesh::kv::HashBlock(kvmesh::kv::kRootBlockHash, std::vector<int32_t>{i}, 0);
        slots.push_back(*(*host)->BeginStore(h, kvmesh::kv::kRootBlockHash));
      }
      double out = 0, sum = 0, in = 0, verify = 0, fused = 0;
      int failures = 0;
      // Batch [first, last) of the shuffled blocks and their slots.
      auto batch = [&](int32_t first, int32_t last) {
        std::vector<kvmesh::kv::KvHostCopy> copies;
        for (int32_t i = first; i < last; ++i) {
          copies.push_back({.block = kvmesh::kv::BlockId{order[static_cast<size_t>(i)]},
                            .host = (*host)->data(slots[static_cast<size_t>(i)]).data()});
        }
        return copies;
      };
      // Copy alone (no checksum), then the tier's path: SwapOut hashing each slice as it
      // copies it, CommitStore taking that checksum. Their order alternates by pass.
      std::vector<uint64_t> checksums(kHostBatch);
      for (int pass = 0; pass < 2; ++pass) {
        const bool hashed = (pass + rep) % 2 == 1;
        for (int32_t first = 0; first < blocks; first += kHostBatch) {
          const int32_t last = std::min(blocks, first + kHostBatch);
          const std::vector<kvmesh::kv::KvHostCopy> copies = batch(first, last);
          const auto t0 = Clock::now();
          if (!hashed) {
            (void)(*pool)->SwapOut(copies, {}, threads);
            out += Seconds(t0, Clock::now());
            continue;
          }
          (void)(*pool)->SwapOut(copies, std::span<uint64_t>(checksums.data(), copies.size()), threads);
          for (int32_t i = first; i < last; ++i) {
            (*host)->CommitStore(slots[static_cast<size_t>(i)], checksums[static_cast<size_t>(i - first)]);
          }
          sum += Seconds(t0, Clock::now());
        }
      }
      // Onboard three ways, in an order that rotates by repetition: the copy alone; a
      // separate Verify pass, then the copy (what a TP or CUDA runner's host hits pay, at
      // lookup); the copy hashing what it reads, compared after (the CPU runner's path).
      for (int variant = 0; variant < 3; ++variant) {
        const int way = (variant + rep) % 3;
        for (int32_t first = 0; first < blocks; first += kHostBatch) {
          const int32_t last = std::min(blocks, first + kHostBatch);
          const std::vector<kvmesh::kv::KvHostCopy> copies = batch(first, last);
          const auto t0 = Clock::now();
          if (way == 0) {
            (void)(*pool)->SwapIn(copies, {}, threads);
            in += Seconds(t0, Clock::now());
          } else if (way == 1) {
            for (int32_t i = first; i < last; ++i) failures += !(*host)->Verify(slots[static_cast<size_t>(i)]).ok();
            (void)(*pool)->SwapIn(copies, {}, threads);
            verify += Seconds(t0, Clock::now());
          } else {
            (void)(*pool)->SwapIn(copies, std::span<uint64_t>(checksums.data(), copies.size()), threads);
            for (int32_t i = first; i < last; ++i) {
              failures += !(*host)->Verify(slots[static_cast<size_t>(i)], checksums[static_cast<size_t>(i - first)]).ok();
            }
            fused += Seconds(t0, Clock::now());
          }
        }
      }
      if (failures > 0) {
        std::fprintf(stderr, "host: %d checksum failures\n", failures);
        return 1;
      }
      out_s.push_back(out);
      sum_s.push_back(sum);
      in_s.push_back(in);
      verify_s.push_back(verify);
      fused_s.push_back(fused);
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const kvmesh::kv::HostCopyBound bound =
        kvmesh::kv::MeasureHostCopyBound(kRecordPayloadBytes, /*repeats=*/9, threads);
    const double m = bound.bytes_per_second / 1e9;
    std::printf("host, %d thread%s (%d blocks = %.2f GiB, batches of %d scattered blocks):\n", threads,
                threads == 1 ? "" : "s", blocks, static_cast<double>(bytes) / (1 << 30), kHostBatch);
    std::printf("  bound: memcpy of %lld-byte blocks between two %.0f MiB buffers on %d thread%s: %.2f GB/s\n",
                static_cast<long long>(kRecordPayloadBytes), bound.buffer_bytes / 1048576.0, bound.num_threads,
                bound.num_threads == 1 ? "" : "s", m);
    const double o = Gbps(bytes, median(out_s)), oc = Gbps(bytes, median(sum_s));
    const double n = Gbps(bytes, median(in_s)), nc = Gbps(bytes, median(verify_s));
    std::printf("  offload: copy hashed + CommitStore: %.2f GB/s  %.0f%% of the bound (target >= 80%%)\n", oc,
                100 * oc / m);
    std::printf("    the copy alone (SwapOut):       %.2f GB/s  %.0f%%\n", o, 100 * o / m);
    const double nf = Gbps(bytes, median(fused_s));
    std::printf("  onboard: SwapIn verifying as it copies: %.2f GB/s  %.0f%% of the bound (target >= 80%%)\n", nf,
                100 * nf / m);
    std::printf("    Verify, then SwapIn (TP/CUDA): %.2f GB/s  %.0f%%\n", nc, 100 * nc / m);
    std::printf("    the copy alone (SwapIn):        %.2f GB/s  %.0f%%\n", n, 100 * n / m);
  }
  return 0;
}
