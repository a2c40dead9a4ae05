// cuda_ceilings_bench: what this GPU can do at best, measured, so that the kernel
// benchmarks have ceilings to be compared with (METHOD.md: datasheet rates are leads).
//
//   d2d_copy_<N>MiB          cudaMemcpyAsync device to device; GB/s counts bytes read + written.
//   hbm_read_16B_<N>MiB      a grid-stride kernel reading 16-byte vectors (uint4) and nothing
//                            else: the pure HBM read rate, which decode attention is bound by.
//   gemm_bf16_8192x8192x8192 cuBLASLt bf16 GEMM (f32 accumulate): TFLOP/s, arithmetic ceiling.
//   gemm_bf16_m<M>_k4096_n<N> the decode-step projections (M tokens times a [N, K] weight,
//                            M = 1..128): weights-bound, so GB/s of weights + activations.
//
// Every buffer holds random bits (never zeros: a GEMM on zeros runs faster). Each case
// rotates among enough buffers that one round touches more than the 60 MB L2, so a
// repeat never hits in L2. Times: cudaEvents around each rep, after warm-up, median.
//
// Usage: cuda_ceilings_bench [--csv PATH] [--quick]
//   --csv PATH  append rows (kernel "cuda_ceiling") in the tools/gpu-check CSV format
//   --quick     small sizes and few reps (a smoke run)
// Without a GPU it says so and exits 0.
//
// Compiled by nvcc (tests/bench/CMakeLists.txt sets LANGUAGE CUDA on this file).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_bench_cli.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

#define CEIL_CHECK_CUBLAS(expr)                                                              \
  do {                                                                                       \
    const cublasStatus_t ceil_st = (expr);                                                   \
    if (ceil_st != CUBLAS_STATUS_SUCCESS) {                                                  \
      std::fprintf(stderr, "cuda_ceilings_bench: %s failed: cublas status %d (%s:%d)\n",     \
                   #expr, static_cast<int>(ceil_st), __FILE__, __LINE__);                    \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

constexpr int64_t kMiB = 1024 * 1024;
constexpr int64_t kL2Bytes = 60 * kMiB;  // H200/H100: 50-60 MB; rotation sizes aim past it

// One result row; the columns of tools/gpu-check's CSV.
struct Row {
  std::string case_name;
  int64_t batch = 0;
  std::string dtype = "-";
  double median_us = 0;
  double gbps = 0;
  double tflops = 0;
  std::string notes;
};

// A splitmix64-style hash of (index, seed): random bits without a generator state.
__device__ uint64_t HashBits(int64_t i, uint32_t seed) {
  uint64_t z = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Fills `words` 32-bit words with random bits.
__global__ void FillRandomBits(uint32_t* data, int64_t words, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    data[i] = static_cast<uint32_t>(HashBits(i, seed));
  }
}

// bf16 values uniform in about [-1, 1): random bits would include NaN and Inf.
__global__ void FillRandomBf16(__nv_bfloat16* data, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(HashBits(i, seed) >> 40) / 16777216.0f;  // [0, 1)
    data[i] = __float2bfloat16(2.0f * u - 1.0f);
  }
}

// Reads `vectors` 16-byte vectors, four loads in flight per thread. The XOR of what was
// read is stored only when it equals a value random data practically never gives, so
// the loads stay live and nothing but the read traffic reaches memory.
__global__ void ReadVectors(const uint4* __restrict__ data, int64_t vectors, uint4* sink) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (; i + 3 * stride < vectors; i += 4 * stride) {
    const uint4 a = __ldg(data + i);
    const uint4 b = __ldg(data + i + stride);
    const uint4 c = __ldg(data + i + 2 * stride);
    const uint4 d = __ldg(data + i + 3 * stride);
    acc.x ^= a.x ^ b.x ^ c.x ^ d.x;
    acc.y ^= a.y ^ b.y ^ c.y ^ d.y;
    acc.z ^= a.z ^ b.z ^ c.z ^ d.z;
    acc.w ^= a.w ^ b.w ^ c.w ^ d.w;
  }
  for (; i < vectors; i += stride) {
    const uint4 a = __ldg(data + i);
    acc.x ^= a.x;
    acc.y ^= a.y;
    acc.z ^= a.z;
    acc.w ^= a.w;
  }
  if ((acc.x & acc.y & acc.z & acc.w) == 0xFFFFFFFFu) *sink = acc;
}

// A device allocation freed on destruction.
class DeviceMemory {
 public:
  explicit DeviceMemory(int64_t bytes) { KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&ptr_, static_cast<size_t>(bytes))); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { cudaFree(ptr_); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

void FillBits(const DeviceMemory& m, int64_t bytes, uint32_t seed) {
  FillRandomBits<<<1024, 256>>>(m.as<uint32_t>(), bytes / 4, seed);
  KVMESH_BENCH_CHECK_CUDA(cudaGetLastError());
}

void FillBf16(const DeviceMemory& m, int64_t n, uint32_t seed) {
  FillRandomBf16<<<1024, 256>>>(m.as<__nv_bfloat16>(), n, seed);
  KVMESH_BENCH_CHECK_CUDA(cudaGetLastError());
}

// Median microseconds of run(rep) over `reps` reps, each between its own pair of events,
// after `warmup` untimed reps. run(rep) must check its own launches.
double MedianMicros(const std::function<void(int)>& run, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) run(i);
  std::vector<cudaEvent_t> start(reps), stop(reps);
  for (int i = 0; i < reps; ++i) {
    KVMESH_BENCH_CHECK_CUDA(cudaEventCreate(&start[i]));
    KVMESH_BENCH_CHECK_CUDA(cudaEventCreate(&stop[i]));
  }
  for (int i = 0; i < reps; ++i) {
    KVMESH_BENCH_CHECK_CUDA(cudaEventRecord(start[i]));
    run(warmup + i);
    KVMESH_BENCH_CHECK_CUDA(cudaEventRecord(stop[i]));
  }
  KVMESH_BENCH_CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> us(reps);
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    KVMESH_BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, start[i], stop[i]));
    us[i] = 1000.0 * ms;
    KVMESH_BENCH_CHECK_CUDA(cudaEventDestroy(start[i]));
    KVMESH_BENCH_CHECK_CUDA(cudaEventDestroy(stop[i]));
  }
  std::sort(us.begin(), us.end());
  return us[reps / 2];
}

Row D2dCopy(const kvmesh::bench::CudaBenchOptions& opt) {
  const int64_t bytes = (opt.quick ? 256 : 4096) * kMiB;
  DeviceMemory src(bytes), dst(bytes);
  FillBits(src, bytes, 1);
  FillBits(dst, bytes, 2);
  const double us = MedianMicros(
      [&](int) {
        KVMESH_BENCH_CHECK_CUDA(cudaMemcpyAsync(dst.as<void>(), src.as<void>(), bytes, cudaMemcpyDeviceToDevice));
      },
      3, opt.quick ? 20 : 30);
  Row r;
  r.case_name = "d2d_copy_" + std::to_string(bytes / kMiB) + "MiB";
  r.median_us = us;
  r.gbps = 2.0 * static_cast<double>(bytes) / (us * 1e3);
  r.notes = "cudaMemcpyAsync; bytes read + written; exceeds L2";
  return r;
}

Row HbmRead(const kvmesh::bench::CudaBenchOptions& opt, const cudaDeviceProp& prop) {
  const int64_t bytes = (opt.quick ? 256 : 4096) * kMiB;
  DeviceMemory data(bytes), sink(sizeof(uint4));
  FillBits(data, bytes, 3);
  constexpr int kThreads = 512;
  int blocks_per_sm = 0;
  KVMESH_BENCH_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, ReadVectors, kThreads, 0));
  const int blocks = std::max(1, blocks_per_sm) * prop.multiProcessorCount;
  const int64_t vectors = bytes / static_cast<int64_t>(sizeof(uint4));
  const double us = MedianMicros(
      [&](int) {
        ReadVectors<<<blocks, kThreads>>>(data.as<uint4>(), vectors, sink.as<uint4>());
        KVMESH_BENCH_CHECK_CUDA(cudaGetLastError());
      },
      3, opt.quick ? 20 : 30);
  Row r;
  r.case_name = "hbm_read_16B_" + std::to_string(bytes / kMiB) + "MiB";
  r.median_us = us;
  r.gbps = static_cast<double>(bytes) / (us * 1e3);
  r.notes = "uint4 __ldg grid-stride; " + std::to_string(blocks) + "x" + std::to_string(kThreads) +
            " threads; bytes read; exceeds L2";
  return r;
}

// D[M, N] = X[M, K] * W[N, K]^T in bf16 (row-major, as a Linear layer), f32 accumulate.
// Column-major for cuBLASLt: D^T (N x M) = op_T(W stored K x N) * X^T (K x M).
class Bf16Gemm {
 public:
  Bf16Gemm(cublasLtHandle_t lt, int64_t m, int64_t n, int64_t k, void* workspace, size_t workspace_bytes)
      : lt_(lt), workspace_(workspace), workspace_bytes_(workspace_bytes) {
    CEIL_CHECK_CUBLAS(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    CEIL_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
    CEIL_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
    CEIL_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&w_layout_, CUDA_R_16BF, k, n, k));
    CEIL_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&x_layout_, CUDA_R_16BF, k, m, k));
    CEIL_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&d_layout_, CUDA_R_16BF, n, m, n));
    cublasLtMatmulPreference_t pref;
    CEIL_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_bytes_;
    CEIL_CHECK_CUBLAS(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    int returned = 0;
    CEIL_CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt_, op_, w_layout_, x_layout_, d_layout_, d_layout_, pref, 1,
                                                     &heuristic_, &returned));
    CEIL_CHECK_CUBLAS(cublasLtMatmulPreferenceDestroy(pref));
    if (returned < 1) {
      std::fprintf(stderr, "cuda_ceilings_bench: cuBLASLt has no algorithm for m=%lld n=%lld k=%lld\n",
                   static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k));
      std::exit(1);
    }
  }
  Bf16Gemm(const Bf16Gemm&) = delete;
  Bf16Gemm& operator=(const Bf16Gemm&) = delete;
  ~Bf16Gemm() {
    cublasLtMatrixLayoutDestroy(d_layout_);
    cublasLtMatrixLayoutDestroy(x_layout_);
    cublasLtMatrixLayoutDestroy(w_layout_);
    cublasLtMatmulDescDestroy(op_);
  }

  void Run(const __nv_bfloat16* w, const __nv_bfloat16* x, __nv_bfloat16* d) const {
    const float alpha = 1.0f, beta = 0.0f;
    CEIL_CHECK_CUBLAS(cublasLtMatmul(lt_, op_, &alpha, w, w_layout_, x, x_layout_, &beta, d, d_layout_, d, d_layout_,
                                     &heuristic_.algo, workspace_, workspace_bytes_, nullptr));
  }

 private:
  cublasLtHandle_t lt_;
  void* workspace_;
  size_t workspace_bytes_;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t w_layout_ = nullptr, x_layout_ = nullptr, d_layout_ = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic_{};
};

// One GEMM case; weights rotate among enough copies that a round exceeds the L2.
Row Gemm(cublasLtHandle_t lt, void* workspace, size_t workspace_bytes, int64_t m, int64_t n, int64_t k, int reps,
         const std::string& case_name) {
  const int64_t w_elems = n * k, x_elems = m * k, d_elems = m * n;
  const int64_t set_bytes = 2 * (w_elems + x_elems + d_elems);
  const int copies = static_cast<int>(std::max<int64_t>(2, (2 * kL2Bytes + set_bytes - 1) / set_bytes));
  std::vector<std::unique_ptr<DeviceMemory>> w, x, d;
  for (int i = 0; i < copies; ++i) {
    w.push_back(std::make_unique<DeviceMemory>(2 * w_elems));
    x.push_back(std::make_unique<DeviceMemory>(2 * x_elems));
    d.push_back(std::make_unique<DeviceMemory>(2 * d_elems));
    FillBf16(*w.back(), w_elems, 10 + 3 * i);
    FillBf16(*x.back(), x_elems, 11 + 3 * i);
    FillBits(*d.back(), 2 * d_elems, 12 + 3 * i);
  }
  const Bf16Gemm gemm(lt, m, n, k, workspace, workspace_bytes);
  const double us = MedianMicros(
      [&](int rep) {
        const int c = rep % copies;
        gemm.Run(w[c]->as<__nv_bfloat16>(), x[c]->as<__nv_bfloat16>(), d[c]->as<__nv_bfloat16>());
      },
      3, reps);
  Row r;
  r.case_name = case_name;
  r.batch = m;
  r.dtype = "bf16";
  r.median_us = us;
  r.gbps = static_cast<double>(set_bytes) / (us * 1e3);
  r.tflops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / (us * 1e6);
  r.notes = "cuBLASLt TN f32 accumulate; bytes = W + X + D; " + std::to_string(copies) + " rotating copies";
  return r;
}

void AppendCsv(const std::string& path, const std::vector<Row>& rows) {
  FILE* f = kvmesh::bench::OpenBenchCsv(path, "cuda_ceilings_bench");
  for (const Row& r : rows) {
    std::fprintf(f, "cuda_ceiling,%s,%lld,0,0,0,0,%s,%.3f,%.1f,%.2f,%s\n", r.case_name.c_str(),
                 static_cast<long long>(r.batch), r.dtype.c_str(), r.median_us, r.gbps, r.tflops, r.notes.c_str());
  }
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  const kvmesh::bench::CudaBenchOptions opt = kvmesh::bench::ParseCudaBenchOptions(argc, argv);
  if (!kvmesh::bench::GpuPresentOrSay("cuda_ceilings_bench")) return 0;
  cudaDeviceProp prop;
  KVMESH_BENCH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("cuda_ceilings_bench on %s: %d SMs, L2 %d MiB, %.1f GiB%s\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / static_cast<int>(kMiB), static_cast<double>(prop.totalGlobalMem) / (1024.0 * kMiB),
              opt.quick ? " (--quick)" : "");

  std::vector<Row> rows;
  rows.push_back(D2dCopy(opt));
  rows.push_back(HbmRead(opt, prop));

  cublasLtHandle_t lt;
  CEIL_CHECK_CUBLAS(cublasLtCreate(&lt));
  const size_t workspace_bytes = 32 * kMiB;
  DeviceMemory workspace(static_cast<int64_t>(workspace_bytes));
  const int64_t big = opt.quick ? 2048 : 8192;
  rows.push_back(Gemm(lt, workspace.as<void>(), workspace_bytes, big, big, big, opt.quick ? 20 : 30,
                      "gemm_bf16_" + std::to_string(big) + "x" + std::to_string(big) + "x" + std::to_string(big)));
  const std::vector<int64_t> ms = opt.quick ? std::vector<int64_t>{1, 32} : std::vector<int64_t>{1, 8, 32, 64, 128};
  for (const int64_t n : {int64_t{4096}, int64_t{14336}}) {
    for (const int64_t m : ms) {
      rows.push_back(Gemm(lt, workspace.as<void>(), workspace_bytes, m, n, 4096, opt.quick ? 20 : 50,
                          "gemm_bf16_m" + std::to_string(m) + "_k4096_n" + std::to_string(n)));
    }
  }
  CEIL_CHECK_CUBLAS(cublasLtDestroy(lt));

  std::printf("%-28s %6s %12s %10s %10s  %s\n", "case", "M", "median_us", "GB/s", "TFLOP/s", "notes");
  for (const Row& r : rows) {
    std::printf("%-28s %6lld %12.2f %10.1f %10.2f  %s\n", r.case_name.c_str(), static_cast<long long>(r.batch),
                r.median_us, r.gbps, r.tflops, r.notes.c_str());
  }
  if (!opt.csv_path.empty()) AppendCsv(opt.csv_path, rows);
  return 0;
}
