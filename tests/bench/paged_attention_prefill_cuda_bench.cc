// paged_attention_prefill_cuda_bench: TFLOP/s of the CUDA prefill attention kernel
// (kernels/paged_attention_prefill) at Llama-3-8B's attention shape (32 query heads, 8 KV
// heads, head_dim 128) over a bf16 pool with 16-token blocks handed out in shuffled order:
// one sequence of 1k / 4k / 16k prompt tokens with no prefix, 8 sequences of 2k, and 512
// new tokens over an 8k cached prefix.
//
// Each case runs both warp shapes: 16 query rows per warp (LaunchPagedAttentionPrefill, kernel
// column paged_attention_prefill) and 32 (kernel column paged_attention_prefill_32rows).
//
// FLOPs are counted causally: 4 * H * D * (sum over query rows of the keys each attends to),
// i.e. QK^T and PV, no softmax. Timed with CUDA events after warm-up, median of >= 20
// launches, rotating among enough copies of q / out / pool that one pass over them exceeds
// the 60 MB L2 twice (the notes say how many). Prints a table; with --csv PATH appends rows
// in tools/gpu-check's format; --quick runs 1x1024, 8x2048 and 512 over 8k only. Exits 0
// with a message where no GPU is present.
//
// Floors (989 TFLOP/s, 4.8 TB/s; q and out are f32 by the launcher's contract): 1x16384 is
// 2.2 TFLOP -> 2.2 ms against 604 MB -> 0.13 ms, compute-bound; 1x1024 is 8.6 GFLOP -> 8.7 us
// against 38 MB -> 7.9 us, both matter; 1x512 over 8k is 71 GFLOP -> 72 us against 52 MB -> 11 us.
#include <algorithm>
#include <array>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_bench_cli.h"

#include "paged_attention_prefill/paged_attention_prefill.h"

namespace {

using kvmesh::kernels::KvCacheDType;
using kvmesh::kernels::kPagedAttentionPrefillRowsPerWarp;
using kvmesh::kernels::LaunchPagedAttentionPrefill;
using kvmesh::kernels::LaunchPagedAttentionPrefillWithRowsPerWarp;
using kvmesh::kernels::PagedAttentionPrefillArgs;

constexpr int32_t kHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlockSize = 16;
constexpr double kPeakTflops = 989.0;  // H100/H200 dense bf16 tensor-core peak
constexpr double kL2Bytes = 60e6;
constexpr int kReps = 25;

struct BenchCase {
  int32_t num_seqs, new_tokens, prefix;
};

struct Result {
  double median_us, gbps, tflops;
  int sets;
  double set_mb;
};

// One copy of everything a launch reads and writes.
struct DeviceSet {
  float* q = nullptr;
  float* out = nullptr;
  void* pool = nullptr;
  int32_t* tables = nullptr;
};

// Both warp shapes, on the same data: [0] 16 query rows per warp (LaunchPagedAttentionPrefill's),
// [1] 32 (LaunchPagedAttentionPrefillWithRowsPerWarp).
constexpr int32_t kRowsPerWarp[2] = {kPagedAttentionPrefillRowsPerWarp, 32};

std::array<Result, 2> Run(const BenchCase& c) {
  const int32_t ctx = c.prefix + c.new_tokens;
  const int32_t blocks_per_seq = (ctx + kBlockSize - 1) / kBlockSize;
  const int32_t num_blocks = blocks_per_seq * c.num_seqs;
  const int64_t num_tokens = int64_t{c.num_seqs} * c.new_tokens;
  const int64_t q_elems = num_tokens * kHeads * kHeadDim;
  const int64_t pool_elems = int64_t{num_blocks} * 2 * kKvHeads * kBlockSize * kHeadDim;
  const double set_bytes = static_cast<double>(q_elems) * 4 * 2 + static_cast<double>(pool_elems) * 2;
  const int sets = std::clamp(static_cast<int>(2 * kL2Bytes / set_bytes) + 1, 1, 8);

  // Host data: random finite q and bf16 K/V (truncated f32 bits), shuffled blocks.
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<float> q(static_cast<size_t>(q_elems));
  for (float& x : q) x = uni(rng);
  std::vector<uint16_t> pool(static_cast<size_t>(pool_elems));
  uint32_t state = 12345u;
  for (uint16_t& x : pool) {
    state = state * 1664525u + 1013904223u;
    float f = static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x = static_cast<uint16_t>(bits >> 16);
  }
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> query_start(static_cast<size_t>(c.num_seqs) + 1),
      context_lens(static_cast<size_t>(c.num_seqs), ctx);
  for (int32_t s = 0; s <= c.num_seqs; ++s) query_start[static_cast<size_t>(s)] = s * c.new_tokens;

  int32_t *d_query_start = nullptr, *d_context_lens = nullptr;
  KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&d_query_start, query_start.size() * sizeof(int32_t)));
  KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&d_context_lens, context_lens.size() * sizeof(int32_t)));
  KVMESH_BENCH_CHECK_CUDA(
      cudaMemcpy(d_query_start, query_start.data(), query_start.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  KVMESH_BENCH_CHECK_CUDA(
      cudaMemcpy(d_context_lens, context_lens.data(), context_lens.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  std::vector<DeviceSet> dev(static_cast<size_t>(sets));
  for (DeviceSet& d : dev) {
    KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&d.q, q.size() * sizeof(float)));
    KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&d.out, q.size() * sizeof(float)));
    KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&d.pool, pool.size() * sizeof(uint16_t)));
    KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&d.tables, ids.size() * sizeof(int32_t)));
    KVMESH_BENCH_CHECK_CUDA(cudaMemcpy(d.q, q.data(), q.size() * sizeof(float), cudaMemcpyHostToDevice));
    KVMESH_BENCH_CHECK_CUDA(cudaMemcpy(d.pool, pool.data(), pool.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    KVMESH_BENCH_CHECK_CUDA(cudaMemcpy(d.tables, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  }

  PagedAttentionPrefillArgs args;
  args.query_start = d_query_start;
  args.context_lens = d_context_lens;
  args.num_seqs = c.num_seqs;
  args.num_tokens = static_cast<int32_t>(num_tokens);
  args.num_heads = kHeads;
  args.num_kv_heads = kKvHeads;
  args.head_dim = kHeadDim;
  args.block_size_tokens = kBlockSize;
  args.max_blocks_per_seq = blocks_per_seq;
  args.max_query_len = c.new_tokens;
  args.scale = 1.f / std::sqrt(static_cast<float>(kHeadDim));
  args.kv_dtype = KvCacheDType::kBf16;

  // Keys attended, summed over query rows: n * prefix + n (n + 1) / 2 per sequence.
  const double n = c.new_tokens;
  const double keys = c.num_seqs * (n * c.prefix + n * (n + 1) / 2);
  const double flops = 4.0 * kHeads * kHeadDim * keys;

  std::array<Result, 2> results{};
  std::vector<cudaEvent_t> events(2 * kReps);
  for (cudaEvent_t& e : events) KVMESH_BENCH_CHECK_CUDA(cudaEventCreate(&e));
  std::vector<float> out(q.size());
  for (int variant = 0; variant < 2; ++variant) {
    for (DeviceSet& d : dev)
      KVMESH_BENCH_CHECK_CUDA(cudaMemset(d.out, 0xff, q.size() * sizeof(float)));  // NaN: unwritten rows show
    auto launch = [&](int i) {
      const DeviceSet& d = dev[static_cast<size_t>(i % sets)];
      args.q = d.q;
      args.out = d.out;
      args.kv_cache = d.pool;
      args.block_tables = d.tables;
      KVMESH_BENCH_CHECK_CUDA(variant == 0 ? LaunchPagedAttentionPrefill(args, nullptr)
                              : LaunchPagedAttentionPrefillWithRowsPerWarp(args, kRowsPerWarp[variant], nullptr));
    };
    for (int i = 0; i < std::max(3, sets); ++i) launch(i);
    KVMESH_BENCH_CHECK_CUDA(cudaDeviceSynchronize());
    for (int r = 0; r < kReps; ++r) {
      KVMESH_BENCH_CHECK_CUDA(cudaEventRecord(events[2 * r], nullptr));
      launch(r);
      KVMESH_BENCH_CHECK_CUDA(cudaEventRecord(events[2 * r + 1], nullptr));
    }
    KVMESH_BENCH_CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<double> us(kReps);
    for (int r = 0; r < kReps; ++r) {
      float ms = 0;
      KVMESH_BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, events[2 * r], events[2 * r + 1]));
      us[static_cast<size_t>(r)] = ms * 1e3;
    }
    std::sort(us.begin(), us.end());
    const double median_us = us[us.size() / 2];

    // Every output of the first set must be written and finite.
    KVMESH_BENCH_CHECK_CUDA(cudaMemcpy(out.data(), dev[0].out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < out.size(); ++i) {
      if (!std::isfinite(out[i])) {
        std::fprintf(stderr, "case %dx%d_prefix%d, %d rows per warp: output %zu is not finite (%f)\n", c.num_seqs,
                     c.new_tokens, c.prefix, kRowsPerWarp[variant], i, static_cast<double>(out[i]));
        std::exit(1);
      }
    }
    results[static_cast<size_t>(variant)] = {median_us, set_bytes / (median_us * 1e3), flops / (median_us * 1e6), sets,
                                             set_bytes / 1e6};
  }
  for (cudaEvent_t& e : events) KVMESH_BENCH_CHECK_CUDA(cudaEventDestroy(e));

  for (DeviceSet& d : dev) {
    KVMESH_BENCH_CHECK_CUDA(cudaFree(d.q));
    KVMESH_BENCH_CHECK_CUDA(cudaFree(d.out));
    KVMESH_BENCH_CHECK_CUDA(cudaFree(d.pool));
    KVMESH_BENCH_CHECK_CUDA(cudaFree(d.tables));
  }
  KVMESH_BENCH_CHECK_CUDA(cudaFree(d_query_start));
  KVMESH_BENCH_CHECK_CUDA(cudaFree(d_context_lens));

  return results;
}

}  // namespace

int main(int argc, char** argv) {
  const kvmesh::bench::CudaBenchOptions options = kvmesh::bench::ParseCudaBenchOptions(argc, argv);
  const bool quick = options.quick;
  if (!kvmesh::bench::GpuPresentOrSay("paged_attention_prefill_cuda_bench")) return 0;
  cudaDeviceProp prop{};
  KVMESH_BENCH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));

  // --quick: the subset tools/gpu_bench_torch.py --quick times too, so the summary pairs them.
  const std::vector<BenchCase> cases =
      quick ? std::vector<BenchCase>{{1, 1024, 0}, {8, 2048, 0}, {1, 512, 8192}}
            : std::vector<BenchCase>{{1, 1024, 0}, {1, 4096, 0}, {1, 16384, 0}, {8, 2048, 0}, {1, 512, 8192}};

  FILE* csv = options.csv_path.empty()
                  ? nullptr
                  : kvmesh::bench::OpenBenchCsv(options.csv_path, "paged_attention_prefill_cuda_bench");

  std::printf("paged attention prefill on %s: H %d, Hkv %d, D %d, B %d, bf16 pool; causal FLOPs\n", prop.name, kHeads,
              kKvHeads, kHeadDim, kBlockSize);
  std::printf("%-20s %-32s %12s %10s %10s %10s %6s\n", "case", "kernel", "median_us", "TFLOP/s", "of 989", "GB/s",
              "sets");
  for (const BenchCase& c : cases) {
    const std::array<Result, 2> results = Run(c);
    char name[64];
    std::snprintf(name, sizeof(name), "%dx%d_prefix%d", c.num_seqs, c.new_tokens, c.prefix);
    for (int variant = 0; variant < 2; ++variant) {
      const Result& r = results[static_cast<size_t>(variant)];
      // The default launcher's rows pair with PyTorch's in tools/gpu-check; the variant's stand apart.
      const char* kernel = variant == 0 ? "paged_attention_prefill" : "paged_attention_prefill_32rows";
      const double frac = r.tflops / kPeakTflops;
      std::printf("%-20s %-32s %12.1f %10.1f %9.1f%% %10.1f %6d\n", name, kernel, r.median_us, r.tflops, 100 * frac,
                  r.gbps, r.sets);
      if (csv != nullptr) {
        std::fprintf(csv,
                     "%s,%s,%d,%d,%d,%d,%d,bf16,%.2f,%.1f,%.2f,"
                     "%d query rows per warp; causal FLOPs 4*H*D*sum(keys per row); %.1f%% of 989 TFLOP/s dense bf16 "
                     "peak; B 16 shuffled blocks; GB/s = one pass over q+out+KV; rotating %d sets of %.0f MB\n",
                     kernel, name, c.num_seqs, c.prefix + c.new_tokens, kHeads, kKvHeads, kHeadDim, r.median_us, r.gbps,
                     r.tflops, kRowsPerWarp[variant], 100 * frac, r.sets, r.set_mb);
      }
    }
  }
  if (csv != nullptr) std::fclose(csv);
  return 0;
}
