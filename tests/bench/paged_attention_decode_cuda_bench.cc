// paged_attention_decode_cuda_bench: GB/s of the paged-attention decode kernel
// (kernels/paged_attention_decode) against the H200's 4800 GB/s of HBM.
//
// Shape: Llama-3-8B heads (32 query heads, 8 KV heads, head_dim 128), B 16, a bf16 pool
// at batch 1/32/128 x context 1k/8k/32k (every sequence at the full context), plus fp8
// and f32 rows at batch 32 x 8k. Block tables are a random permutation of the pool's blocks.
// Bytes counted: the KV read (2 * context * Hkv * D * element bytes per sequence) plus q and
// out (f32); the split-K workspace traffic is not counted (it is the kernel's overhead).
// Data set vs the 60 MB L2: each case rotates among enough disjoint sets of block tables
// (and q/out) that the KV touched by one rotation is >= 256 MB; the notes say how many.
// Times: cudaEvents around one rotation sweep after a warm-up sweep, divided by the number
// of launches in it; the median of 20 sweeps.
//
// Usage: paged_attention_decode_cuda_bench [--csv PATH] [--quick]
//   --csv PATH  append rows (kernel "paged_attention_decode") in the tools/gpu-check CSV format
//   --quick     two small cases, 5 sweeps (a smoke run)
// Without a GPU it says so and exits 0.
#include <cuda_runtime.h>

#include "cuda_bench_cli.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "paged_attention_decode/paged_attention_decode.h"

namespace {

using kvmesh::kernels::KvCacheDType;
using kvmesh::kernels::PagedAttentionDecodeArgs;

constexpr int32_t kHeads = 32;
constexpr int32_t kKvHeads = 8;
constexpr int32_t kHeadDim = 128;
constexpr int32_t kBlockSize = 16;
constexpr double kHbmGbps = 4800.0;
constexpr int64_t kRotationBytes = int64_t{256} << 20;  // KV touched per rotation sweep, >> 60 MB L2
constexpr int32_t kMaxRotations = 64;
constexpr int64_t kPatternBytes = int64_t{64} << 20;

struct Case {
  int32_t batch = 0;
  int32_t context = 0;
  KvCacheDType dtype = KvCacheDType::kBf16;
};

struct Row {
  Case c;
  double median_us = 0;
  double gbps = 0;
  std::string notes;
};

const char* DTypeName(KvCacheDType t) {
  return t == KvCacheDType::kF32 ? "f32" : t == KvCacheDType::kBf16 ? "bf16" : "fp8";
}
int64_t ElementBytes(KvCacheDType t) { return t == KvCacheDType::kF32 ? 4 : t == KvCacheDType::kBf16 ? 2 : 1; }
int64_t BlockBytes(KvCacheDType t) { return 2 * int64_t{kKvHeads} * kBlockSize * kHeadDim * ElementBytes(t); }

// kPatternBytes of random, finite values in the pool's encoding (never zeros, never NaN).
std::vector<uint8_t> Pattern(KvCacheDType dtype) {
  std::vector<uint8_t> bytes(static_cast<size_t>(kPatternBytes));
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  if (dtype == KvCacheDType::kFp8E4M3) {
    // Bit 6 clear: exponent <= 7, so no NaN code (0x7f / 0xff), magnitudes below 2.
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng()) & 0xbf;
  } else if (dtype == KvCacheDType::kBf16) {
    for (size_t i = 0; i < bytes.size(); i += 2) {
      const float x = normal(rng);
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      const uint16_t hi = static_cast<uint16_t>(bits >> 16);  // truncation is fine for timing
      std::memcpy(bytes.data() + i, &hi, 2);
    }
  } else {
    for (size_t i = 0; i < bytes.size(); i += 4) {
      const float x = normal(rng);
      std::memcpy(bytes.data() + i, &x, 4);
    }
  }
  return bytes;
}

// Fills [pool, pool + bytes) with the dtype's pattern, device to device.
void FillPool(void* pool, int64_t bytes, KvCacheDType dtype) {
  const std::vector<uint8_t> pattern = Pattern(dtype);
  void* device_pattern = nullptr;
  KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&device_pattern, pattern.size()));
  KVMESH_BENCH_CHECK_CUDA(cudaMemcpy(device_pattern, pattern.data(), pattern.size(), cudaMemcpyHostToDevice));
  for (int64_t at = 0; at < bytes; at += kPatternBytes) {
    const int64_t n = std::min(kPatternBytes, bytes - at);
    KVMESH_BENCH_CHECK_CUDA(cudaMemcpy(static_cast<uint8_t*>(pool) + at, device_pattern, static_cast<size_t>(n),
                              cudaMemcpyDeviceToDevice));
  }
  KVMESH_BENCH_CHECK_CUDA(cudaDeviceSynchronize());
  KVMESH_BENCH_CHECK_CUDA(cudaFree(device_pattern));
}

Row RunCase(const Case& c, int sweeps) {
  const int64_t blocks_per_seq = (c.context + kBlockSize - 1) / kBlockSize;
  const int64_t kv_bytes_per_call = int64_t{c.batch} * 2 * c.context * kKvHeads * kHeadDim * ElementBytes(c.dtype);
  const int32_t rotations = static_cast<int32_t>(
      std::clamp<int64_t>((kRotationBytes + kv_bytes_per_call - 1) / kv_bytes_per_call, 1, kMaxRotations));
  const int64_t num_blocks = int64_t{rotations} * c.batch * blocks_per_seq;
  const int64_t pool_bytes = num_blocks * BlockBytes(c.dtype);

  void* pool = nullptr;
  KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&pool, static_cast<size_t>(pool_bytes)));
  FillPool(pool, pool_bytes, c.dtype);

  // Block tables: a random permutation of the pool's blocks, rotation r taking the r-th slice.
  std::mt19937 rng(static_cast<uint32_t>(c.batch * 7919 + c.context));
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  int32_t* tables = nullptr;
  KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&tables, ids.size() * sizeof(int32_t)));
  KVMESH_BENCH_CHECK_CUDA(cudaMemcpy(tables, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));

  const size_t q_elems = static_cast<size_t>(c.batch) * kHeads * kHeadDim;
  std::vector<float> q_host(q_elems * static_cast<size_t>(rotations));
  std::normal_distribution<float> normal;
  for (float& x : q_host) x = normal(rng);
  float* q = nullptr;
  float* out = nullptr;
  KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&q, q_host.size() * sizeof(float)));
  KVMESH_BENCH_CHECK_CUDA(cudaMemcpy(q, q_host.data(), q_host.size() * sizeof(float), cudaMemcpyHostToDevice));
  KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&out, q_host.size() * sizeof(float)));
  const std::vector<int32_t> lens_host(static_cast<size_t>(c.batch), c.context);
  int32_t* lens = nullptr;
  KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&lens, lens_host.size() * sizeof(int32_t)));
  KVMESH_BENCH_CHECK_CUDA(
      cudaMemcpy(lens, lens_host.data(), lens_host.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  const std::vector<float> scales_host(kKvHeads, 0.05f);
  float* scales = nullptr;
  KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&scales, scales_host.size() * sizeof(float)));
  KVMESH_BENCH_CHECK_CUDA(
      cudaMemcpy(scales, scales_host.data(), scales_host.size() * sizeof(float), cudaMemcpyHostToDevice));

  std::vector<PagedAttentionDecodeArgs> args(static_cast<size_t>(rotations));
  for (int32_t r = 0; r < rotations; ++r) {
    args[static_cast<size_t>(r)] = {
        .q = q + static_cast<size_t>(r) * q_elems,
        .kv_cache = pool,
        .context_lens = lens,
        .block_tables = tables + int64_t{r} * c.batch * blocks_per_seq,
        .k_scale = scales,
        .v_scale = scales,
        .out = out + static_cast<size_t>(r) * q_elems,
        .num_seqs = c.batch,
        .num_heads = kHeads,
        .num_kv_heads = kKvHeads,
        .head_dim = kHeadDim,
        .block_size_tokens = kBlockSize,
        .max_blocks_per_seq = static_cast<int32_t>(blocks_per_seq),
        .max_context_len = c.context,
        .scale = 1.f / std::sqrt(static_cast<float>(kHeadDim)),
        .kv_dtype = c.dtype,
    };
  }
  const size_t ws_bytes = kvmesh::kernels::PagedAttentionDecodeWorkspaceBytes(args[0]);
  void* workspace = nullptr;
  if (ws_bytes > 0) KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&workspace, ws_bytes));

  cudaStream_t stream;
  KVMESH_BENCH_CHECK_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  KVMESH_BENCH_CHECK_CUDA(cudaEventCreate(&start));
  KVMESH_BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  auto sweep = [&] {
    for (const PagedAttentionDecodeArgs& a : args) {
      KVMESH_BENCH_CHECK_CUDA(kvmesh::kernels::LaunchPagedAttentionDecode(a, workspace, ws_bytes, stream));
    }
  };
  sweep();  // warm-up
  KVMESH_BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> us;
  for (int i = 0; i < sweeps; ++i) {
    KVMESH_BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
    sweep();
    KVMESH_BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
    KVMESH_BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    KVMESH_BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(static_cast<double>(ms) * 1e3 / rotations);
  }
  std::sort(us.begin(), us.end());

  // A finite output is the least a timing run must show.
  std::vector<float> out_host(q_elems);
  KVMESH_BENCH_CHECK_CUDA(cudaMemcpy(out_host.data(), out, q_elems * sizeof(float), cudaMemcpyDeviceToHost));
  const bool finite = std::all_of(out_host.begin(), out_host.end(), [](float x) { return std::isfinite(x); });

  Row row{.c = c, .median_us = us[us.size() / 2]};
  const double bytes = static_cast<double>(kv_bytes_per_call) + 2.0 * static_cast<double>(q_elems) * 4.0;
  row.gbps = bytes / (row.median_us * 1e-6) / 1e9;
  const double rotation_mb = static_cast<double>(kv_bytes_per_call) * rotations / (1 << 20);
  char notes[256];
  std::snprintf(notes, sizeof(notes), "frac_of_4800GBps=%.3f; B=16; %d rotation(s) of %.0f MB KV %s L2%s",
                row.gbps / kHbmGbps, rotations, rotation_mb, rotation_mb > 60 ? "exceed" : "fit in",
                finite ? "" : "; NON-FINITE OUTPUT");
  row.notes = notes;

  KVMESH_BENCH_CHECK_CUDA(cudaEventDestroy(start));
  KVMESH_BENCH_CHECK_CUDA(cudaEventDestroy(stop));
  KVMESH_BENCH_CHECK_CUDA(cudaStreamDestroy(stream));
  for (void* p : {pool, static_cast<void*>(tables), static_cast<void*>(q), static_cast<void*>(out),
                  static_cast<void*>(lens), static_cast<void*>(scales), workspace}) {
    KVMESH_BENCH_CHECK_CUDA(cudaFree(p));
  }
  return row;
}

void AppendCsv(const std::string& path, const std::vector<Row>& rows) {
  FILE* f = kvmesh::bench::OpenBenchCsv(path, "paged_attention_decode_cuda_bench");
  for (const Row& r : rows) {
    std::fprintf(f, "paged_attention_decode,b%d_ctx%d_%s,%d,%d,%d,%d,%d,%s,%.3f,%.2f,0,%s\n", r.c.batch, r.c.context,
                 DTypeName(r.c.dtype), r.c.batch, r.c.context, kHeads, kKvHeads, kHeadDim, DTypeName(r.c.dtype),
                 r.median_us, r.gbps, r.notes.c_str());
  }
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  const kvmesh::bench::CudaBenchOptions options = kvmesh::bench::ParseCudaBenchOptions(argc, argv);
  const std::string& csv_path = options.csv_path;
  const bool quick = options.quick;
  if (!kvmesh::bench::GpuPresentOrSay("paged_attention_decode_cuda_bench")) return 0;
  cudaDeviceProp prop;
  KVMESH_BENCH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("paged_attention_decode_cuda_bench on %s (%d SMs, %d MB L2)%s: H %d, Hkv %d, D %d, B %d\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, quick ? " (--quick)" : "", kHeads, kKvHeads, kHeadDim,
              kBlockSize);

  std::vector<Case> cases;
  if (quick) {
    cases = {{32, 1024, KvCacheDType::kBf16}, {1, 8192, KvCacheDType::kBf16}};
  } else {
    // 128 x 32k bf16 is the largest pool: 16 GiB.
    for (int32_t batch : {1, 32, 128}) {
      for (int32_t context : {1024, 8192, 32768}) cases.push_back({batch, context, KvCacheDType::kBf16});
    }
    cases.push_back({32, 8192, KvCacheDType::kFp8E4M3});
    cases.push_back({128, 32768, KvCacheDType::kFp8E4M3});
    cases.push_back({32, 8192, KvCacheDType::kF32});
  }
  const int sweeps = quick ? 5 : 20;
  std::vector<Row> rows;
  std::printf("%-22s %12s %12s %10s  %s\n", "case", "median_us", "GB/s", "of 4800", "notes");
  for (const Case& c : cases) {
    rows.push_back(RunCase(c, sweeps));
    const Row& r = rows.back();
    char name[64];
    std::snprintf(name, sizeof(name), "b%d_ctx%d_%s", c.batch, c.context, DTypeName(c.dtype));
    std::printf("%-22s %12.2f %12.1f %9.1f%%  %s\n", name, r.median_us, r.gbps, 100.0 * r.gbps / kHbmGbps,
                r.notes.c_str());
    std::fflush(stdout);
  }
  if (!csv_path.empty()) AppendCsv(csv_path, rows);
  return 0;
}
