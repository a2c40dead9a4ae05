// What every CUDA benchmark shares with tools/gpu-check: the command line
// ([--csv PATH] [--quick]), the "no GPU here" exit, and the CSV file with its header.
// Header-only: the benchmarks are single files.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cuda_runtime.h>

// Exits 1, naming the failed call and where, when a CUDA runtime call fails (a benchmark
// has nothing sensible to time after that).
#define KVMESH_BENCH_CHECK_CUDA(expr)                                                                 \
  do {                                                                                                \
    const cudaError_t kvmesh_bench_err = (expr);                                                      \
    if (kvmesh_bench_err != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #expr, cudaGetErrorString(kvmesh_bench_err),    \
                   __FILE__, __LINE__);                                                               \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

namespace kvmesh::bench {

struct CudaBenchOptions {
  std::string csv_path;  // empty: no CSV
  bool quick = false;    // a smoke run: few cases, few repetitions
};

// Parses [--csv PATH] [--quick]; anything else prints the usage and exits 2.
inline CudaBenchOptions ParseCudaBenchOptions(int argc, char** argv) {
  CudaBenchOptions options;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
      options.csv_path = argv[++i];
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      options.quick = true;
    } else {
      std::fprintf(stderr, "usage: %s [--csv PATH] [--quick]\n", argv[0]);
      std::exit(2);
    }
  }
  return options;
}

// True where a CUDA device can be used; otherwise prints "<name>: no GPU here (why);
// nothing measured" and returns false (the benchmark then exits 0).
inline bool GpuPresentOrSay(const char* name) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess && count > 0) return true;
  std::printf("%s: no GPU here (%s); nothing measured\n", name,
              err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
  return false;
}

// PATH opened for appending, with tools/gpu-check's header written when the file is new;
// exits 1 (naming `name`) when it cannot be opened.
inline FILE* OpenBenchCsv(const std::string& path, const char* name) {
  FILE* f = std::fopen(path.c_str(), "a+");
  if (f == nullptr) {
    std::fprintf(stderr, "%s: cannot open %s\n", name, path.c_str());
    std::exit(1);
  }
  std::fseek(f, 0, SEEK_END);
  if (std::ftell(f) == 0) {
    std::fprintf(f,
                 "kernel,case,batch,context,num_heads,num_kv_heads,head_dim,kv_dtype,median_us,achieved_gbps,"
                 "achieved_tflops,notes\n");
  }
  return f;
}

}  // namespace kvmesh::bench
