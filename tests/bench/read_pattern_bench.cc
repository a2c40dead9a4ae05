// read_pattern_bench: how fast this machine's cores read memory in the patterns
// decode uses, beside the STREAM copy bandwidth the other benches take as their
// roofline (#16). Weights and KV are only read, and a copy counts its reads and
// its writes: on a core whose misses in flight are few, a copy moves more bytes
// per second than a read alone can, so "x% of copy" targets can lie above what
// any reading kernel reaches. This prints where.
//
// Rows (1 GiB on huge pages, 2 MiB-aligned and advised, far past the caches; GB/s
// of bytes read, median of 7):
//   sequential, 1 and 4 streams per thread;
//   shuffled runs of --run-bytes (default 12 KiB: one SmolLM2 bf16 KV block, all
//   heads), visited in a random order as paged attention visits blocks, with
//     no software prefetch, every line of the run 2 ahead prefetched into L2 at
//     once before the run is read ("burst"), the same lines prefetched one per
//     line read from inside the reading loop ("spread", as paged attention does),
//     or only each 4 KiB page's first two lines of it (which starts the L2
//     streamer without holding a line-fill buffer per line);
//   and the same shuffled walks with dependent work on every loaded line (FMAs on
//   the loaded value, about what attention does per byte), which limits how far
//   ahead out-of-order execution can issue the loads.
//
// Usage: read_pattern_bench [--threads N] [--run-bytes B]
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/memory_bandwidth.h"
#include "bench_timer.h"
#include "core/huge_pages.h"

namespace kvmesh {
namespace {

constexpr int64_t kBufferBytes = int64_t{1} << 30;
constexpr int64_t kPageBytes = 4096;
constexpr int kAhead = 2;  // runs ahead that a prefetching walk prefetches

enum class Prefetch { kNone, kEveryLine, kSpread, kPageStarts };

volatile float sink = 0.0f;

// Sums [p, p + bytes) (a multiple of 256) in 64-byte loads, independent sums;
// with kWork, four FMAs on each loaded vector (SmolLM2's attention, three query
// heads per KV head, does three per loaded K or V value, on that value). One load
// per line, as the engine's AVX-512 kernels: 32-byte loads hold twice the
// load-buffer entries per line and keep fewer lines in flight. kSpread: with each
// line read, prefetch the same line of `ahead` (a run as long) into L2.
template <bool kWork, bool kSpread>
__attribute__((target("avx512f"))) float SumRun(const char* p, int64_t bytes, const char* ahead) {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  __m512 w[4] = {a[0], a[0], a[0], a[0]};
  const __m512 m = _mm512_set1_ps(0.999f);
  for (int64_t off = 0; off < bytes; off += 256) {
    for (int v = 0; v < 4; ++v) {
      if constexpr (kSpread) {
        if (ahead != nullptr) _mm_prefetch(ahead + off + 64 * v, _MM_HINT_T1);
      }
      const __m512 x = _mm512_load_ps(reinterpret_cast<const float*>(p + off + 64 * v));
      a[v] = _mm512_add_ps(a[v], x);
      if constexpr (kWork) {
        for (int i = 0; i < 4; ++i) w[(v + i) % 4] = _mm512_fmadd_ps(w[(v + i) % 4], m, x);
      }
    }
  }
  for (int v = 1; v < 4; ++v) a[0] = _mm512_add_ps(a[0], _mm512_add_ps(a[v], w[v]));
  alignas(64) float lanes[16];  // (not _mm512_reduce_add_ps: GCC 12 warns inside it)
  _mm512_store_ps(lanes, _mm512_add_ps(a[0], w[0]));
  float total = 0.0f;
  for (float x : lanes) total += x;
  return total;
}

using SumRunFn = float (*)(const char*, int64_t, const char*);

SumRunFn PickSumRun(bool work, Prefetch how = Prefetch::kNone) {
  if (how == Prefetch::kSpread) return work ? &SumRun<true, true> : &SumRun<false, true>;
  return work ? &SumRun<true, false> : &SumRun<false, false>;
}

void PrefetchRun(const char* p, int64_t bytes, Prefetch how) {
  if (how == Prefetch::kEveryLine) {
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T1);
  } else if (how == Prefetch::kPageStarts) {
    for (int64_t b = 0; b < bytes; b += kPageBytes) {
      _mm_prefetch(p + b, _MM_HINT_T1);
      _mm_prefetch(p + b + 64, _MM_HINT_T1);
    }
  }
}

// Each thread reads its contiguous share in `streams` interleaved pieces.
void Sequential(const char* base, int threads, int streams, SumRunFn sum) {
  float total = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const int64_t share = kBufferBytes / omp_get_num_threads();
    const char* p = base + share * omp_get_thread_num();
    const int64_t piece = share / streams;
    constexpr int64_t kStep = 4096;
    for (int64_t off = 0; off < piece; off += kStep) {
      for (int s = 0; s < streams; ++s) total += sum(p + s * piece + off, kStep, nullptr);
    }
  }
  sink = total;
}

void Shuffled(const char* base, const std::vector<int32_t>& order, int64_t run_bytes, int threads, Prefetch how,
              bool work) {
  const SumRunFn sum = PickSumRun(work, how);
  float total = 0.0f;
  const int64_t n = static_cast<int64_t>(order.size());
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const int64_t nt = omp_get_num_threads();
    const int64_t begin = n * omp_get_thread_num() / nt;
    const int64_t end = n * (omp_get_thread_num() + 1) / nt;
    for (int64_t i = begin; i < end; ++i) {
      const char* ahead = i + kAhead < end ? base + order[i + kAhead] * run_bytes : nullptr;
      if (ahead != nullptr) PrefetchRun(ahead, run_bytes, how);
      total += sum(base + order[i] * run_bytes, run_bytes, ahead);  // kSpread's sum prefetches `ahead`
    }
  }
  sink = total;
}

int Main(int argc, char** argv) {
  int threads = omp_get_num_procs();
  int64_t run_bytes = 12288;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--run-bytes") == 0 && i + 1 < argc) {
      run_bytes = std::max<int64_t>(256, std::atoll(argv[++i]) / 256 * 256);
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--run-bytes B]\n", argv[0]);
      return 2;
    }
  }
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "read_pattern_bench: needs AVX-512\n");
    return 1;
  }
  HugePageMemory memory = AllocateHugePageMemory(kBufferBytes);
  if (memory == nullptr) {
    std::fprintf(stderr, "read_pattern_bench: cannot allocate %lld bytes\n", static_cast<long long>(kBufferBytes));
    return 1;
  }
  char* base = reinterpret_cast<char*>(memory.get());
  // First touch by the threads that read (pages land where they are used).
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < kBufferBytes; i += 4096) std::memset(base + i, 1, 4096);

  const double copy = backend::MeasureCopyBandwidthBytesPerSecond(threads);
  std::printf("read_pattern_bench: %d threads, 1 GiB buffer, copy bandwidth (STREAM copy, read+write) %.2f GB/s\n\n",
              threads, copy / 1e9);
  std::vector<int32_t> order(static_cast<size_t>(kBufferBytes / run_bytes));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(1));

  auto row = [&](const char* name, auto&& fn) {
    const double seconds = bench::MedianSeconds(fn, 7, 0.0, 7);
    const double bw = static_cast<double>(kBufferBytes) / seconds;
    std::printf("  %-52s %7.2f GB/s  %5.1f%% of copy\n", name, bw / 1e9, 100.0 * bw / copy);
  };
  std::printf("pattern (GB/s read)\n");
  row("sequential, 1 stream per thread", [&] { Sequential(base, threads, 1, PickSumRun(false)); });
  row("sequential, 4 streams per thread", [&] { Sequential(base, threads, 4, PickSumRun(false)); });
  char name[96];
  for (bool work : {false, true}) {
    const char* suffix = work ? ", with work" : "";
    std::snprintf(name, sizeof(name), "shuffled %lld B runs, no prefetch%s", static_cast<long long>(run_bytes), suffix);
    row(name, [&] { Shuffled(base, order, run_bytes, threads, Prefetch::kNone, work); });
    std::snprintf(name, sizeof(name), "shuffled %lld B runs, every line, burst%s", static_cast<long long>(run_bytes),
                  suffix);
    row(name, [&] { Shuffled(base, order, run_bytes, threads, Prefetch::kEveryLine, work); });
    std::snprintf(name, sizeof(name), "shuffled %lld B runs, every line, spread%s", static_cast<long long>(run_bytes),
                  suffix);
    row(name, [&] { Shuffled(base, order, run_bytes, threads, Prefetch::kSpread, work); });
    std::snprintf(name, sizeof(name), "shuffled %lld B runs, page starts prefetched%s", static_cast<long long>(run_bytes),
                  suffix);
    row(name, [&] { Shuffled(base, order, run_bytes, threads, Prefetch::kPageStarts, work); });
  }
  return 0;
}

}  // namespace
}  // namespace kvmesh

int main(int argc, char** argv) { return kvmesh::Main(argc, argv); }
