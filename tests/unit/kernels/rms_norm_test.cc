// The CUDA RMSNorm kernel against the scalar reference backend. Skips where no
// GPU is present (CI), with the reason in the skip message.
#include "rms_norm/rms_norm.h"

#include <cmath>
#include <random>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/dtype.h"

namespace kvmesh::kernels {
namespace {

bool HaveGpu(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {  // "driver version is insufficient" where there is no GPU
    *why = cudaGetErrorString(err);
    return false;
  }
  if (count == 0) *why = "no CUDA device";
  return count > 0;
}

TEST(RmsNormKernelTest, MatchesReferenceBackend) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no GPU here (" << why << "); runs in tools/gpu-check";
  for (int64_t hidden : {64, 257, 4096}) {
    const int64_t tokens = 3;
    std::mt19937 rng(hidden);
    std::normal_distribution<float> normal;
    std::vector<float> x(tokens * hidden), out(tokens * hidden), ref(tokens * hidden);
    std::vector<uint16_t> weight(hidden);
    for (float& v : x) v = normal(rng);
    for (uint16_t& w : weight) w = F32ToBf16(1.0f + 0.1f * normal(rng));
    float *dx, *dout;
    uint16_t* dw;
    ASSERT_EQ(cudaMalloc(&dx, x.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dout, x.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dw, weight.size() * 2), cudaSuccess);
    cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, weight.data(), weight.size() * 2, cudaMemcpyHostToDevice);
    ASSERT_EQ(LaunchRmsNormF32Bf16Weight(dx, dw, 1e-5f, tokens, hidden, dout, nullptr), cudaSuccess);
    cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost);
    cudaFree(dx);
    cudaFree(dout);
    cudaFree(dw);
    auto reference = backend::CreateReferenceBackend();
    reference->RmsNorm(TensorView::Contiguous(x.data(), DType::kF32, {tokens, hidden}),
                       TensorView::Contiguous(weight.data(), DType::kBF16, {hidden}), 1e-5f,
                       TensorView::Contiguous(ref.data(), DType::kF32, {tokens, hidden}));
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5f * (1 + std::fabs(ref[i]))) << i;
  }
}

}  // namespace
}  // namespace kvmesh::kernels
