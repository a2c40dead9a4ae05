// backend_bench: the CPU backend's GEMM against oneDNN (packed weights,
// fixed-M primitives, f32 and bf16) and OpenBLAS sgemm on the default model's
// shapes, and decode GEMV bandwidth as a fraction of the machine's copy
// bandwidth (the roofline). Prints medians of several runs.
//
// Usage: backend_bench [--threads N] [--quick] [--decode-only] [--isa auto|amx|avx512|avx2]
//                      [--linear-sweep] [--shape SUBSTRING] [--m 16,64]
// --linear-sweep: only our Linear's GFLOP/s (bf16 and f32 weights) on the
// default model's shapes at M = 1, 8, 16, 32, 64, 256 (the batched-decode range).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/memory_bandwidth.h"
#include "backend/ops.h"
#include "bench_timer.h"
#include "core/dtype.h"
#include "core/tensor_view.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "dnnl.hpp"

extern "C" void openblas_set_num_threads(int num_threads);

namespace kvmesh::backend {
namespace {

using Clock = std::chrono::steady_clock;

double MedianSeconds(const std::function<void()>& fn, int min_runs = 5) {
  return bench::MedianSeconds(fn, min_runs, 0.25, 200);
}

std::vector<float> RandomFloats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = F32ToBf16(v[i]);
  return out;
}

struct Shape {
  const char* name;
  int64_t n;
  int64_t k;
};

// oneDNN matmul with weights reordered once into the primitive's preferred
// (packed) layout; one primitive per M, as kvmesh would cache them.
class DnnlMatmul {
 public:
  DnnlMatmul(dnnl::engine& engine, int64_t m, int64_t n, int64_t k, bool bf16, const std::vector<float>& w_nk)
      : engine_(engine), stream_(engine) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dt wdt = bf16 ? dt::bf16 : dt::f32;
    dnnl::memory::desc src_md({m, k}, wdt, tag::ab);
    dnnl::memory::desc wei_any({k, n}, wdt, tag::any);
    dnnl::memory::desc dst_md({m, n}, dt::f32, tag::ab);
    dnnl::matmul::desc desc(src_md, wei_any, dst_md);
    pd_ = dnnl::matmul::primitive_desc(desc, engine_);
    prim_ = dnnl::matmul(pd_);
    // User weights [N, K] row-major == [K, N] in "ba".
    dnnl::memory::desc user_md({k, n}, dt::f32, tag::ba);
    dnnl::memory user(user_md, engine_, const_cast<float*>(w_nk.data()));
    weights_ = dnnl::memory(pd_.weights_desc(), engine_);
    dnnl::reorder(user, weights_).execute(stream_, user, weights_);
    src_ = dnnl::memory(src_md, engine_);
    dst_ = dnnl::memory(dst_md, engine_);
    // Activations: random, in the source type.
    const std::vector<float> x = RandomFloats(m * k, 7);
    dnnl::memory user_x(dnnl::memory::desc({m, k}, dt::f32, tag::ab), engine_, const_cast<float*>(x.data()));
    dnnl::reorder(user_x, src_).execute(stream_, user_x, src_);
    stream_.wait();
  }
  void Run() {
    prim_.execute(stream_, {{DNNL_ARG_SRC, src_}, {DNNL_ARG_WEIGHTS, weights_}, {DNNL_ARG_DST, dst_}});
    stream_.wait();
  }
  std::string impl() const { return pd_.impl_info_str(); }

 private:
  dnnl::engine& engine_;
  dnnl::stream stream_;
  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul prim_;
  dnnl::memory weights_, src_, dst_;
};

struct Packed {
  std::unique_ptr<PackedLinear> f32;
  std::unique_ptr<PackedLinear> bf16;
};

int LinearSweep(Backend& backend) {
  const std::vector<Shape> shapes = {{"qkv 768x512", 768, 512},
                                     {"o 512x512", 512, 512},
                                     {"gate_up 2816x512", 2816, 512},
                                     {"down 512x1408", 512, 1408},
                                     {"lm_head 32000x512", 32000, 512}};
  const std::vector<int64_t> ms = {1, 8, 16, 32, 64, 256};
  std::printf("Linear GFLOP/s (median), C[M,N] = X[M,K] W[N,K]^T, activations f32\n%-18s %5s", "shape", "weights");
  for (int64_t m : ms) std::printf(" %7s%-3ld", "M=", static_cast<long>(m));
  std::printf("\n");
  for (const Shape& s : shapes) {
    const std::vector<float> w = RandomFloats(s.n * s.k, 1);
    const std::vector<uint16_t> w16 = ToBf16(w);
    TensorView wv = TensorView::Contiguous(const_cast<float*>(w.data()), DType::kF32, {s.n, s.k});
    TensorView wv16 = TensorView::Contiguous(const_cast<uint16_t*>(w16.data()), DType::kBF16, {s.n, s.k});
    Packed packed{backend.PackLinear({&wv, 1}, {}).value(), backend.PackLinear({&wv16, 1}, {}).value()};
    for (int bf16 = 1; bf16 >= 0; --bf16) {
      std::printf("%-18s %5s", s.name, bf16 ? "bf16" : "f32");
      for (int64_t m : ms) {
        const std::vector<float> x = RandomFloats(m * s.k, 2);
        std::vector<float> out(static_cast<size_t>(m * s.n));
        TensorView xv = TensorView::Contiguous(const_cast<float*>(x.data()), DType::kF32, {m, s.k});
        TensorView ov = TensorView::Contiguous(out.data(), DType::kF32, {m, s.n});
        const double flops = 2.0 * static_cast<double>(m * s.n * s.k);
        const double t = MedianSeconds([&] { backend.Linear(xv, bf16 ? *packed.bf16 : *packed.f32, ov); }, 21);
        std::printf(" %10.1f", flops / t / 1e9);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  // A whole step's linears of the default model (8 layers of qkv, o, gate_up,
  // down, then lm_head; bf16, ~78 MB: weights come from the LLC, not L2).
  std::vector<std::unique_ptr<PackedLinear>> linears;
  double step_flops_per_row = 0.0;
  for (int layer = 0; layer < 8; ++layer) {
    for (const Shape& s : shapes) {
      if (s.n == 32000) continue;
      const std::vector<uint16_t> w16 = ToBf16(RandomFloats(s.n * s.k, 10 + layer));
      TensorView wv = TensorView::Contiguous(const_cast<uint16_t*>(w16.data()), DType::kBF16, {s.n, s.k});
      linears.push_back(backend.PackLinear({&wv, 1}, {}).value());
      step_flops_per_row += 2.0 * static_cast<double>(s.n * s.k);
    }
  }
  {
    const std::vector<uint16_t> head = ToBf16(RandomFloats(32000 * 512, 110));
    TensorView hv = TensorView::Contiguous(const_cast<uint16_t*>(head.data()), DType::kBF16, {32000, 512});
    linears.push_back(backend.PackLinear({&hv, 1}, {}).value());
    step_flops_per_row += 2.0 * 32000 * 512;
  }
  std::printf("%-18s %5s", "model step", "bf16");
  for (int64_t m : ms) {
    const std::vector<float> x = RandomFloats(m * 1408, 3);
    std::vector<float> y(static_cast<size_t>(m * 32000));
    auto step = [&] {
      for (const auto& l : linears) {
        backend.Linear(TensorView::Contiguous(const_cast<float*>(x.data()), DType::kF32, {m, l->in_features()}), *l,
                       TensorView::Contiguous(y.data(), DType::kF32, {m, l->out_features()}));
      }
    };
    const double t = MedianSeconds(step, 11);
    std::printf(" %10.1f", step_flops_per_row * static_cast<double>(m) / t / 1e9);
  }
  std::printf("\n");
  return 0;
}

int Run(int argc, char** argv) {
  int threads = omp_get_num_procs();
  bool quick = false;
  bool decode_only = false;
  bool linear_sweep = false;
  std::string isa = "auto";
  std::string only_shape;        // --shape SUBSTRING: only GEMM shapes whose name holds it
  std::vector<int64_t> only_ms;  // --m 16,64: only these M
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--isa") == 0 && i + 1 < argc) isa = argv[++i];
    if (std::strcmp(argv[i], "--shape") == 0 && i + 1 < argc) only_shape = argv[++i];
    if (std::strcmp(argv[i], "--m") == 0 && i + 1 < argc) {
      for (absl::string_view m : absl::StrSplit(argv[++i], ',')) only_ms.push_back(std::atoll(std::string(m).c_str()));
    }
    if (std::strcmp(argv[i], "--linear-sweep") == 0) linear_sweep = true;
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--decode-only") == 0) decode_only = true;
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  auto backend_or = CreateCpuBackend({.num_threads = threads, .isa = isa});
  if (!backend_or.ok()) {
    std::fprintf(stderr, "%s\n", backend_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<Backend> backend = std::move(backend_or).value();
  // The bf16 compute mode (CpuBackendOptions::compute_dtype), its column beside ours.
  std::unique_ptr<Backend> bf16c = CreateCpuBackend({.num_threads = threads, .isa = isa, .compute_dtype = DType::kBF16}).value();
  std::printf("backend %s, %d threads\n", std::string(backend->name()).c_str(), threads);

  if (linear_sweep) return LinearSweep(*backend);

  const double copy_bw = MeasureCopyBandwidthBytesPerSecond(threads);
  const double read_bw = MeasureReadBandwidthBytesPerSecond(threads);
  std::printf("copy bandwidth (STREAM copy, read+write, median of 7): %.2f GB/s; read bandwidth (a sum): %.2f GB/s\n\n",
              copy_bw / 1e9, read_bw / 1e9);

  const std::vector<Shape> shapes = {{"qkv 768x512", 768, 512},       {"gate_up 2816x512", 2816, 512},
                                     {"down 512x1408", 512, 1408},    {"lm_head 32000x512", 32000, 512},
                                     {"square 2048x2048", 2048, 2048}};
  const std::vector<int64_t> ms = !only_ms.empty() ? only_ms
                                  : quick          ? std::vector<int64_t>{1, 8, 16, 256}
                                                   : std::vector<int64_t>{1, 8, 16, 64, 256, 1024};
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);

  std::printf("GEMM GFLOP/s (median), C[M,N] = X[M,K] W[N,K]^T; ours keeps activations f32, except\n"
              "bf16c: the bf16 compute mode (activations rounded to bf16, as dnnl-bf16 does)\n");
  std::printf("%-18s %5s | %8s %8s %8s | %9s %9s | %8s | %8s %8s %8s %8s\n", "shape", "M", "ours-f32", "ours-bf16",
              "bf16c", "dnnl-f32", "dnnl-bf16", "blas-f32", "o32/d32", "o16/d32", "o16/d16", "o16c/d16");
  struct GemvRow {
    std::string shape;
    int64_t m;
    double bytes;
    double seconds;
  };
  std::vector<GemvRow> gemv_rows;
  for (const Shape& s : shapes) {
    if (decode_only) break;
    if (std::string(s.name).find(only_shape) == std::string::npos) continue;
    const std::vector<float> w = RandomFloats(s.n * s.k, 1);
    const std::vector<uint16_t> w16 = ToBf16(w);
    TensorView wv = TensorView::Contiguous(const_cast<float*>(w.data()), DType::kF32, {s.n, s.k});
    TensorView wv16 = TensorView::Contiguous(const_cast<uint16_t*>(w16.data()), DType::kBF16, {s.n, s.k});
    Packed packed{backend->PackLinear({&wv, 1}, {}).value(), backend->PackLinear({&wv16, 1}, {}).value()};
    std::unique_ptr<PackedLinear> packed_bf16c = bf16c->PackLinear({&wv16, 1}, {}).value();
    for (int64_t m : ms) {
      const std::vector<float> x = RandomFloats(m * s.k, 2);
      std::vector<float> out(static_cast<size_t>(m * s.n));
      TensorView xv = TensorView::Contiguous(const_cast<float*>(x.data()), DType::kF32, {m, s.k});
      TensorView ov = TensorView::Contiguous(out.data(), DType::kF32, {m, s.n});
      const double flops = 2.0 * static_cast<double>(m * s.n * s.k);
      const double t32 = MedianSeconds([&] { backend->Linear(xv, *packed.f32, ov); });
      const double t16 = MedianSeconds([&] { backend->Linear(xv, *packed.bf16, ov); });
      const double t16c = MedianSeconds([&] { bf16c->Linear(xv, *packed_bf16c, ov); });
      DnnlMatmul d32(engine, m, s.n, s.k, false, w);
      DnnlMatmul d16(engine, m, s.n, s.k, true, w);
      const double td32 = MedianSeconds([&] { d32.Run(); });
      const double td16 = MedianSeconds([&] { d16.Run(); });
      const double tb = MedianSeconds([&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(s.n),
                    static_cast<int>(s.k), 1.0f, x.data(), static_cast<int>(s.k), w.data(), static_cast<int>(s.k),
                    0.0f, out.data(), static_cast<int>(s.n));
      });
      std::printf("%-18s %5ld | %8.1f %8.1f %8.1f | %9.1f %9.1f | %8.1f | %8.2f %8.2f %8.2f %8.2f\n", s.name,
                  static_cast<long>(m), flops / t32 / 1e9, flops / t16 / 1e9, flops / t16c / 1e9, flops / td32 / 1e9,
                  flops / td16 / 1e9, flops / tb / 1e9, td32 / t32, td32 / t16, td16 / t16, td16 / t16c);
      if (m == 1 || m == 8) {
        gemv_rows.push_back({std::string(s.name) + " bf16", m, static_cast<double>(packed.bf16->num_bytes()), t16});
        gemv_rows.push_back({std::string(s.name) + " f32", m, static_cast<double>(packed.f32->num_bytes()), t32});
      }
    }
    std::fflush(stdout);
  }

  std::printf("\nDecode GEMV (weights hot in the %s): achieved weight bandwidth vs copy bandwidth %.2f GB/s\n",
              "LLC where they fit", copy_bw / 1e9);
  std::printf("%-26s %3s %10s %10s %8s\n", "shape", "M", "us", "GB/s", "of copy");
  for (const GemvRow& r : gemv_rows) {
    const double bw = r.bytes / r.seconds;
    std::printf("%-26s %3ld %10.1f %10.2f %7.0f%%\n", r.shape.c_str(), static_cast<long>(r.m), r.seconds * 1e6,
                bw / 1e9, 100.0 * bw / copy_bw);
  }

  // A whole decode step's linears of the default model (8 layers: qkv, o,
  // gate_up, down; then lm_head), bf16. "hot": one copy (~78 MB, fits this
  // machine's reported 480 MiB L3); "cold": enough copies (>= 1 GiB) cycled so
  // that every step streams its weights from DRAM.
  struct Layer {
    int64_t n, k;
  };
  const std::vector<Layer> model = {{768, 512}, {512, 512}, {2816, 512}, {512, 1408}};
  auto pack_model = [&](uint32_t seed) {
    std::vector<std::unique_ptr<PackedLinear>> linears;
    for (int layer = 0; layer < 8; ++layer) {
      for (const Layer& l : model) {
        const std::vector<uint16_t> w16 = ToBf16(RandomFloats(l.n * l.k, seed + layer));
        TensorView wv = TensorView::Contiguous(const_cast<uint16_t*>(w16.data()), DType::kBF16, {l.n, l.k});
        linears.push_back(backend->PackLinear({&wv, 1}, {}).value());
      }
    }
    const std::vector<uint16_t> head = ToBf16(RandomFloats(32000 * 512, seed + 100));
    TensorView hv = TensorView::Contiguous(const_cast<uint16_t*>(head.data()), DType::kBF16, {32000, 512});
    linears.push_back(backend->PackLinear({&hv, 1}, {}).value());
    return linears;
  };
  std::vector<std::vector<std::unique_ptr<PackedLinear>>> copies;
  double model_bytes = 0.0;
  copies.push_back(pack_model(10));
  for (const auto& l : copies[0]) model_bytes += static_cast<double>(l->num_bytes());
  const int num_copies = quick ? 1 : static_cast<int>(std::ceil((1 << 30) / model_bytes)) + 1;
  for (int c = 1; c < num_copies; ++c) copies.push_back(pack_model(10 + 1000 * c));
  std::vector<float> x(32000 * 32), y(32000 * 32);
  std::fill(x.begin(), x.end(), 0.01f);
  std::printf("\nDecode step, all linears of the default model, bf16 weights %.1f MB per step\n", model_bytes / 1e6);
  std::printf("%-6s %3s %10s %10s %8s %8s\n", "", "M", "us/step", "GB/s", "of copy", "of read");
  for (int64_t m : {1, 8, 16, 32}) {
    for (int cold = 0; cold <= (num_copies > 1 ? 1 : 0); ++cold) {
      int next = 0;
      auto step = [&] {
        const auto& linears = copies[cold ? (next++ % num_copies) : 0];
        for (const auto& l : linears) {
          backend->Linear(TensorView::Contiguous(x.data(), DType::kF32, {m, l->in_features()}), *l,
                          TensorView::Contiguous(y.data(), DType::kF32, {m, l->out_features()}));
        }
      };
      const double t = MedianSeconds(step, 3 * num_copies);
      std::printf("%-6s %3ld %10.1f %10.2f %7.0f%% %7.0f%%\n", cold ? "cold" : "hot", static_cast<long>(m), t * 1e6,
                  model_bytes / t / 1e9, 100.0 * model_bytes / t / copy_bw, 100.0 * model_bytes / t / read_bw);
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvmesh::backend

int main(int argc, char** argv) { return kvmesh::backend::Run(argc, argv); }
