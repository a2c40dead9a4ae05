// swap_blocks_cuda_bench: GB/s of moving KV blocks between device memory and pinned host
// memory (kernels/swap_blocks), offload (device -> host) and onboard (host -> device),
// with the one-launch 16-byte copy kernel and with one cudaMemcpyAsync per (layer, block)
// (vLLM's swap_blocks), and the kernel / memcpy ratio.
//
// Shape: a Llama-3-8B layer group, 32 layers, 8 KV heads, head_dim 128, B 16, bf16: 64 KiB
// per block per layer (2 MiB per block over all layers). 256 and 2048 blocks per swap, as
// a random permutation of pool blocks (pools of 2048 blocks on each side, 4 GiB each).
// GB/s counts the bytes moved once (num_blocks * 2 MiB): the host link carries each once.
// Each swap moves >= 512 MiB, far past the 60 MB L2, so no rotation is needed.
// Times: cudaEvents around each rep, after warm-up, median of 20.
//
// Usage: swap_blocks_cuda_bench [--csv PATH] [--quick]
//   --csv PATH  append rows (kernel "swap_blocks") in the tools/gpu-check CSV format
//   --quick     4 layers, 256 blocks, 5 reps (a smoke run)
// Without a GPU it says so and exits 0.
#include <cuda_runtime.h>

#include "cuda_bench_cli.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "swap_blocks/swap_blocks.h"

namespace {

using kvmesh::kernels::BlockPoolShape;

constexpr int64_t kBlockBytes = 2 * 8 * 16 * 128 * 2;  // K and V, 8 heads, B 16, D 128, bf16: 64 KiB
constexpr int64_t kPoolBlocks = 2048;

struct Row {
  std::string case_name;
  int64_t blocks = 0;
  double median_us = 0;
  double gbps = 0;
  std::string notes;
};

// Median microseconds of `launch` (enqueue on `stream`) over `reps` timed runs after 2 warm-ups.
template <typename F>
double MedianUs(F launch, cudaStream_t stream, int reps) {
  cudaEvent_t start, stop;
  KVMESH_BENCH_CHECK_CUDA(cudaEventCreate(&start));
  KVMESH_BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 2; ++i) KVMESH_BENCH_CHECK_CUDA(launch());
  KVMESH_BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    KVMESH_BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
    KVMESH_BENCH_CHECK_CUDA(launch());
    KVMESH_BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
    KVMESH_BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    KVMESH_BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(static_cast<double>(ms) * 1e3);
  }
  KVMESH_BENCH_CHECK_CUDA(cudaEventDestroy(start));
  KVMESH_BENCH_CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void AppendCsv(const std::string& path, const std::vector<Row>& rows) {
  FILE* f = kvmesh::bench::OpenBenchCsv(path, "swap_blocks_cuda_bench");
  for (const Row& r : rows) {
    std::fprintf(f, "swap_blocks,%s,%lld,0,0,8,128,bf16,%.3f,%.2f,0,%s\n", r.case_name.c_str(),
                 static_cast<long long>(r.blocks), r.median_us, r.gbps, r.notes.c_str());
  }
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  const kvmesh::bench::CudaBenchOptions options = kvmesh::bench::ParseCudaBenchOptions(argc, argv);
  const std::string& csv_path = options.csv_path;
  const bool quick = options.quick;
  if (!kvmesh::bench::GpuPresentOrSay("swap_blocks_cuda_bench")) return 0;
  cudaDeviceProp prop;
  KVMESH_BENCH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int64_t layers = quick ? 4 : 32;
  const int reps = quick ? 5 : 20;
  std::printf("swap_blocks_cuda_bench on %s (%d SMs)%s: %lld layers x %lld KiB per block per layer\n", prop.name,
              prop.multiProcessorCount, quick ? " (--quick)" : "", static_cast<long long>(layers),
              static_cast<long long>(kBlockBytes / 1024));

  const BlockPoolShape shape{
      .num_layers = layers, .layer_bytes = kPoolBlocks * kBlockBytes, .block_bytes = kBlockBytes};
  const auto pool_bytes = static_cast<size_t>(layers * shape.layer_bytes);
  void* device_pool = nullptr;
  void* host_pool = nullptr;
  KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&device_pool, pool_bytes));
  KVMESH_BENCH_CHECK_CUDA(cudaHostAlloc(&host_pool, pool_bytes, cudaHostAllocMapped));
  // Random bytes, never zeros: fill one block's worth on the host and replicate it.
  {
    std::vector<uint8_t> pattern(static_cast<size_t>(shape.layer_bytes));
    std::mt19937 rng(7);
    for (uint8_t& b : pattern) b = static_cast<uint8_t>(rng());
    for (int64_t l = 0; l < layers; ++l) {
      std::memcpy(static_cast<char*>(host_pool) + l * shape.layer_bytes, pattern.data(), pattern.size());
    }
    KVMESH_BENCH_CHECK_CUDA(cudaMemcpy(device_pool, host_pool, pool_bytes, cudaMemcpyHostToDevice));
  }
  void* host_pool_device = nullptr;
  KVMESH_BENCH_CHECK_CUDA(cudaHostGetDevicePointer(&host_pool_device, host_pool, 0));
  cudaStream_t stream;
  KVMESH_BENCH_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::vector<Row> rows;
  const std::vector<int64_t> block_counts = quick ? std::vector<int64_t>{256} : std::vector<int64_t>{256, 2048};
  for (const int64_t n : block_counts) {
    // Pairs: n distinct random source blocks onto n distinct random destination blocks.
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::vector<int32_t> src(kPoolBlocks), dst(kPoolBlocks);
    std::iota(src.begin(), src.end(), 0);
    std::iota(dst.begin(), dst.end(), 0);
    std::shuffle(src.begin(), src.end(), rng);
    std::shuffle(dst.begin(), dst.end(), rng);
    std::vector<int32_t> pairs;
    for (int64_t i = 0; i < n; ++i) {
      pairs.push_back(src[static_cast<size_t>(i)]);
      pairs.push_back(dst[static_cast<size_t>(i)]);
    }
    int32_t* pairs_device = nullptr;
    KVMESH_BENCH_CHECK_CUDA(cudaMalloc(&pairs_device, pairs.size() * sizeof(int32_t)));
    KVMESH_BENCH_CHECK_CUDA(
        cudaMemcpy(pairs_device, pairs.data(), pairs.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    const double bytes = static_cast<double>(n * layers * kBlockBytes);

    for (const bool offload : {true, false}) {
      const void* from = offload ? device_pool : host_pool_device;
      void* to = offload ? host_pool_device : device_pool;
      const void* from_memcpy = offload ? device_pool : host_pool;
      void* to_memcpy = offload ? host_pool : device_pool;
      const double kernel_us = MedianUs(
          [&] { return kvmesh::kernels::LaunchSwapBlocks(from, to, shape, shape, pairs_device, n, stream); }, stream,
          reps);
      const double memcpy_us = MedianUs(
          [&] {
            return kvmesh::kernels::LaunchSwapBlocksMemcpy(from_memcpy, to_memcpy, shape, shape, pairs.data(), n,
                                                           stream);
          },
          stream, reps);
      const std::string dir = offload ? "d2h" : "h2d";
      const std::string ratio = std::to_string(memcpy_us / kernel_us);
      rows.push_back({dir + "_kernel_" + std::to_string(layers) + "layers", n, kernel_us, bytes / (kernel_us * 1e3),
                      "one launch; 16-byte zero-copy accesses to pinned host memory; kernel/memcpy speedup " + ratio});
      rows.push_back({dir + "_memcpy_" + std::to_string(layers) + "layers", n, memcpy_us, bytes / (memcpy_us * 1e3),
                      "one cudaMemcpyAsync per (layer; block) (vLLM swap_blocks)"});
    }
    KVMESH_BENCH_CHECK_CUDA(cudaFree(pairs_device));
  }

  std::printf("%-22s %7s %12s %10s  %s\n", "case", "blocks", "median_us", "GB/s", "notes");
  for (const Row& r : rows) {
    std::printf("%-22s %7lld %12.1f %10.2f  %s\n", r.case_name.c_str(), static_cast<long long>(r.blocks),
                r.median_us, r.gbps, r.notes.c_str());
  }
  if (!csv_path.empty()) AppendCsv(csv_path, rows);
  KVMESH_BENCH_CHECK_CUDA(cudaStreamDestroy(stream));
  KVMESH_BENCH_CHECK_CUDA(cudaFreeHost(host_pool));
  KVMESH_BENCH_CHECK_CUDA(cudaFree(device_pool));
  return 0;
}
