// paged_attention_bench: the CPU backend's PagedAttention. Decode (one query
// token per sequence) reports achieved K+V read bandwidth (bytes of every
// sequence's context K and V, all KV heads, / median time) as a fraction of the
// machine's copy bandwidth and of its read bandwidth (memory_bandwidth.h: a K/V stream
// only reads, so the read bandwidth is its roofline);
// prefill reports GFLOP/s of one 512-token chunk (4 * H * D flops per causal
// query-key pair: QK and PV, a multiply-add counted as 2).
//
// Usage: paged_attention_bench [--threads N] [--isa auto|avx512|avx2] [--quick] [--model SUBSTRING]
// (--model: only the shapes whose name contains it, e.g. "bf16" for SmolLM2's)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/memory_bandwidth.h"
#include "backend/ops.h"
#include "bench_timer.h"
#include "kv/kv_layout.h"
#include "core/dtype.h"
#include "core/tensor_view.h"

namespace kvmesh::backend {
namespace {

using Clock = std::chrono::steady_clock;

double MedianSeconds(const std::function<void()>& fn, int min_runs = 7) {
  return bench::MedianSeconds(fn, min_runs, 0.3, 500);
}

struct Model {
  const char* name;
  int64_t h;
  int64_t hkv;
  int64_t d;
  DType kv_dtype = DType::kF32;
};

constexpr int64_t kBlockSize = 16;

// A pool holding `num_seqs` contexts of `context` tokens in shuffled blocks.
struct Setup {
  std::unique_ptr<kvmesh::kv::KvStorage> cache;  // the engine's own pool type (huge-page advised)
  std::vector<float> q;
  std::vector<float> out;
  std::vector<int32_t> query_start;
  std::vector<int32_t> context_lens;
  std::vector<int32_t> tables;
  int32_t max_blocks = 0;
  int64_t num_blocks = 0;
};

Setup MakeSetup(const Model& m, int64_t num_seqs, int64_t context, int64_t queries_per_seq, uint32_t seed) {
  Setup s;
  s.max_blocks = static_cast<int32_t>((context + kBlockSize - 1) / kBlockSize);
  s.num_blocks = num_seqs * s.max_blocks;
  std::vector<int32_t> pool(static_cast<size_t>(s.num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(pool.begin(), pool.end(), rng);
  s.tables = pool;
  s.cache = kvmesh::kv::KvStorage::Create({.num_layers = 1,
                                           .num_kv_heads = static_cast<int32_t>(m.hkv),
                                           .head_dim = static_cast<int32_t>(m.d),
                                           .block_size_tokens = static_cast<int32_t>(kBlockSize),
                                           .dtype = m.kv_dtype,
                                           .num_blocks = static_cast<int32_t>(s.num_blocks)})
                .value();
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t elems = s.num_blocks * 2 * m.hkv * kBlockSize * m.d;
  if (m.kv_dtype == DType::kBF16) {
    uint16_t* cache = reinterpret_cast<uint16_t*>(s.cache->data());
    for (int64_t i = 0; i < elems; ++i) cache[i] = F32ToBf16(dist(rng));
  } else {
    float* cache = reinterpret_cast<float*>(s.cache->data());
    for (int64_t i = 0; i < elems; ++i) cache[i] = dist(rng);
  }
  const int64_t t = num_seqs * queries_per_seq;
  s.q.resize(static_cast<size_t>(t * m.h * m.d));
  for (auto& x : s.q) x = dist(rng);
  s.out.resize(s.q.size());
  s.query_start.push_back(0);
  for (int64_t i = 0; i < num_seqs; ++i) {
    s.query_start.push_back(static_cast<int32_t>((i + 1) * queries_per_seq));
    s.context_lens.push_back(static_cast<int32_t>(context));
  }
  return s;
}

double Run(Backend& backend, const Model& m, Setup& s) {
  const int64_t t = s.query_start.back();
  const TensorView q = TensorView::Contiguous(s.q.data(), DType::kF32, {t, m.h, m.d});
  const TensorView out = TensorView::Contiguous(s.out.data(), DType::kF32, {t, m.h, m.d});
  const TensorView cache = s.cache->LayerView(0);
  const PagedAttentionBatch batch{s.query_start, s.context_lens, s.tables, s.max_blocks};
  const float scale = 1.0f / std::sqrt(static_cast<float>(m.d));
  return MedianSeconds([&] { backend.PagedAttention(q, cache, batch, scale, out); });
}

int Main(int argc, char** argv) {
  int threads = 0;
  std::string isa = "auto";
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
      isa = argv[++i];
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--isa auto|avx512|avx2] [--quick] [--model SUBSTRING]\n", argv[0]);
      return 2;
    }
  }
  auto backend_or = CreateCpuBackend({.num_threads = threads, .isa = isa});
  if (!backend_or.ok()) {
    std::fprintf(stderr, "%s\n", std::string(backend_or.status().message()).c_str());
    return 1;
  }
  Backend& backend = **backend_or;
  const double copy_bw = MeasureCopyBandwidthBytesPerSecond(threads);
  const double read_bw = MeasureReadBandwidthBytesPerSecond(threads);
  std::printf("backend %s, threads %d, block size %lld, copy bandwidth %.2f GB/s, read bandwidth %.2f GB/s\n",
              std::string(backend.name()).c_str(), threads, static_cast<long long>(kBlockSize), copy_bw / 1e9,
              read_bw / 1e9);

  // The last: SmolLM2-135M's attention with the bf16 KV `kvmesh serve` gives a bf16 model.
  const Model models[] = {{"H=8 Hkv=2 D=64", 8, 2, 64},
                          {"H=32 Hkv=8 D=128", 32, 8, 128},
                          {"H=9 Hkv=3 D=64 bf16", 9, 3, 64, DType::kBF16}};
  std::printf("\ndecode (1 query token per sequence): median time, K+V read bandwidth, fraction of copy and of read "
              "bandwidth\n");
  for (const Model& m : models) {
    if (std::string(m.name).find(only) == std::string::npos) continue;
    for (int64_t batch : {1, 16, 64}) {
      for (int64_t context : {512, 2048, 8192}) {
        const int64_t kv_bytes = batch * context * 2 * m.hkv * m.d * DTypeSize(m.kv_dtype);
        if (quick && kv_bytes > (int64_t{1} << 30)) continue;
        Setup s = MakeSetup(m, batch, context, 1, 1);
        const double sec = Run(backend, m, s);
        const double bw = static_cast<double>(kv_bytes) / sec;
        std::printf("  %-20s batch %3lld ctx %5lld  KV %8.1f MiB  %9.1f us  %7.2f GB/s  %5.1f%% of copy  %5.1f%% of read\n",
                    m.name, static_cast<long long>(batch), static_cast<long long>(context), kv_bytes / 1048576.0,
                    sec * 1e6, bw / 1e9, 100.0 * bw / copy_bw, 100.0 * bw / read_bw);
      }
    }
  }
  std::printf("\nprefill (one 512-token chunk, causal, with and without a cached prefix): GFLOP/s\n");
  for (const Model& m : models) {
    if (std::string(m.name).find(only) == std::string::npos) continue;
    for (int64_t prefix : {0, 1536}) {
      const int64_t n = 512;
      Setup s = MakeSetup(m, 1, prefix + n, n, 2);
      const double sec = Run(backend, m, s);
      // Causal pairs: row i sees prefix + i + 1 keys.
      const double pairs = static_cast<double>(n) * prefix + n * (n + 1) / 2.0;
      const double flops = pairs * 4.0 * m.h * m.d;
      std::printf("  %-20s chunk 512 prefix %4lld  %9.1f us  %7.1f GFLOP/s\n", m.name, static_cast<long long>(prefix),
                  sec * 1e6, flops / sec / 1e9);
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvmesh::backend

int main(int argc, char** argv) { return kvmesh::backend::Main(argc, argv); }
