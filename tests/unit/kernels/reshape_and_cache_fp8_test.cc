// The CUDA reshape_and_cache kernel writing an FP8 e4m3 pool with per-KV-head scales,
// against the host's F32ToFp8E4M3(x / scale) (core/dtype.h) at kv_layout.h's offsets,
// bit for bit. The pool (two layers; the kernel writes layer 1) starts as random bytes,
// so every byte not written must come back unchanged; rows with slot -1 are padding.
// Also: the host conversion against cuda_fp8.h's own host-callable conversion (that part
// needs no GPU and runs everywhere nvcc is). Skips the kernel cases where no GPU is present.
#include "reshape_and_cache/reshape_and_cache.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "kv/kv_layout.h"

namespace kvmesh::kernels {
namespace {

using test_util::DeviceBuffer;

uint8_t CudaFp8(float x) { return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)); }

// NOTE: needs no GPU (cuda_fp8.h's conversions are host-callable); the suite name keeps it
// in tools/gpu-check's run too. An exhaustive sweep of all 2^32 floats (10 s) also agreed
// when this was written; 16M random bit patterns plus every boundary is the standing check.
TEST(Fp8E4M3CudaHostTest, HostConversionMatchesCudaFp8BitForBit) {
  std::vector<float> boundaries = {0.0f, -0.0f, 448.0f, -448.0f, 464.0f, -464.0f, 480.0f, 500.0f, 1e30f,
                                   std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                   std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                                   std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xffc00001u),
                                   std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()};
  // Every code's value, the midpoints between neighbouring codes, and one f32 ulp either side.
  for (int c = 0; c < 0x7f; ++c) {
    const float lo = Fp8E4M3ToF32(static_cast<uint8_t>(c));
    const float hi = c + 1 < 0x7f ? Fp8E4M3ToF32(static_cast<uint8_t>(c + 1)) : 480.0f;
    const float mid = lo + (hi - lo) / 2;  // exact: one more bit than e4m3 has
    for (float x : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), std::nextafter(lo, 0.0f),
                    std::nextafter(lo, 1e9f)}) {
      boundaries.push_back(x);
      boundaries.push_back(-x);
    }
  }
  for (float x : boundaries) {
    ASSERT_EQ(F32ToFp8E4M3(x), CudaFp8(x)) << "x = " << x << " bits " << std::hex << std::bit_cast<uint32_t>(x);
  }
  std::mt19937 rng(20261130);
  for (int i = 0; i < (1 << 24); ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    // Half the draws over all bit patterns, half concentrated on e4m3's range (|x| < 2^10).
    const uint32_t u = (i & 1) ? bits : (bits & 0x80ffffffu) | ((0x6du + (bits >> 24) % 0x14u) << 23);
    const float x = std::bit_cast<float>(u);
    ASSERT_EQ(F32ToFp8E4M3(x), CudaFp8(x)) << "bits " << std::hex << u;
  }
  for (int c = 0; c < 256; ++c) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), __NV_E4M3);
    const float cuda = __half2float(__half(h));
    const float mine = Fp8E4M3ToF32(static_cast<uint8_t>(c));
    if (std::isnan(cuda)) {
      EXPECT_TRUE(std::isnan(mine)) << c;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(mine), std::bit_cast<uint32_t>(cuda)) << c;
    }
  }
}

struct CacheCase {
  int32_t kv_heads, head_dim, block_size, tokens;
};

TEST(ReshapeAndCacheFp8KernelTest, MatchesHostE4M3BitForBitAndRoundTrips) {
  KVMESH_SKIP_WITHOUT_GPU();
  for (const CacheCase& c : {CacheCase{1, 64, 16, 1}, CacheCase{2, 128, 16, 257}, CacheCase{8, 64, 5, 257},
                             CacheCase{8, 128, 5, 1}, CacheCase{1, 128, 16, 257}, CacheCase{2, 64, 5, 33}}) {
    SCOPED_TRACE(::testing::Message() << "Hkv " << c.kv_heads << " D " << c.head_dim << " B " << c.block_size
                                      << " T " << c.tokens);
    const int32_t num_blocks = (c.tokens + c.block_size - 1) / c.block_size + 3;
    auto storage = kv::KvStorage::Create({.num_layers = 2,
                                          .num_kv_heads = c.kv_heads,
                                          .head_dim = c.head_dim,
                                          .block_size_tokens = c.block_size,
                                          .dtype = DType::kFP8E4M3,
                                          .num_blocks = num_blocks})
                       .value();
    const kv::KvLayout& layout = storage->layout();
    std::mt19937 rng(static_cast<uint32_t>(c.kv_heads * 131 + c.head_dim + c.tokens));
    for (int64_t i = 0; i < storage->size_bytes(); ++i) storage->data()[i] = static_cast<std::byte>(rng());
    const std::vector<std::byte> initial(storage->data(), storage->data() + storage->size_bytes());

    // Scales differ per head and between K and V; values span e4m3's range after scaling,
    // with a few beyond it (saturate), a NaN and infinities.
    std::vector<float> k_scale(static_cast<size_t>(c.kv_heads)), v_scale(k_scale.size());
    std::uniform_real_distribution<float> scale_dist(0.01f, 0.3f);
    for (float& s : k_scale) s = scale_dist(rng);
    for (float& s : v_scale) s = scale_dist(rng);
    const size_t row = static_cast<size_t>(c.kv_heads) * static_cast<size_t>(c.head_dim);
    std::vector<float> k(row * static_cast<size_t>(c.tokens)), v(k.size());
    std::normal_distribution<float> normal(0.0f, 8.0f);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    k[0] = 1000.0f;  // / scale > 448: saturates
    v[0] = std::numeric_limits<float>::quiet_NaN();
    if (k.size() > 2) {
      k[1] = std::numeric_limits<float>::infinity();
      v[1] = -std::numeric_limits<float>::infinity();
      k[2] = 1e-6f;  // underflows in e4m3
    }
    std::vector<int64_t> all_slots(static_cast<size_t>(num_blocks) * static_cast<size_t>(c.block_size));
    std::iota(all_slots.begin(), all_slots.end(), 0);
    std::shuffle(all_slots.begin(), all_slots.end(), rng);
    std::vector<int64_t> slots(all_slots.begin(), all_slots.begin() + c.tokens);
    if (c.tokens > 4) slots[3] = -1;  // padding: its slot must stay untouched

    DeviceBuffer<std::byte> dpool(initial);
    DeviceBuffer<float> dk(k), dv(v), dks(k_scale), dvs(v_scale);
    DeviceBuffer<int64_t> dslots(slots);
    const KvCacheShape shape{.num_kv_heads = c.kv_heads, .head_dim = c.head_dim, .block_size_tokens = c.block_size};
    auto* layer1 = reinterpret_cast<uint8_t*>(dpool.get() + layout.LayerBytes());
    ASSERT_EQ(LaunchReshapeAndCacheFp8(dk.get(), dv.get(), dslots.get(), c.tokens, shape, dks.get(), dvs.get(),
                                       layer1, nullptr),
              cudaSuccess);
    const std::vector<std::byte> gpu = dpool.Download();

    // The expected pool: the initial bytes with each written element replaced.
    std::vector<std::byte> expected = initial;
    for (int32_t t = 0; t < c.tokens; ++t) {
      if (slots[static_cast<size_t>(t)] < 0) continue;
      for (int32_t h = 0; h < c.kv_heads; ++h) {
        for (int32_t d = 0; d < c.head_dim; ++d) {
          const size_t src = static_cast<size_t>(t) * row + static_cast<size_t>(h * c.head_dim + d);
          const int64_t k_at = layout.SlotOffset(1, 0, h, slots[static_cast<size_t>(t)]) + int64_t{d} * c.block_size;
          const int64_t v_at = layout.SlotOffset(1, 1, h, slots[static_cast<size_t>(t)]) + int64_t{d};
          expected[static_cast<size_t>(k_at)] = static_cast<std::byte>(F32ToFp8E4M3(k[src] / k_scale[h]));
          expected[static_cast<size_t>(v_at)] = static_cast<std::byte>(F32ToFp8E4M3(v[src] / v_scale[h]));
        }
      }
    }
    for (size_t i = 0; i < gpu.size(); ++i) {
      ASSERT_EQ(static_cast<int>(gpu[i]), static_cast<int>(expected[i]))
          << "pool byte " << i << (expected[i] == initial[i] ? " (must be untouched)" : " (written)");
    }

    // Round trip: decoded * scale is within half an e4m3 ulp (relative 2^-4) of the input
    // wherever x / scale lies in e4m3's normal range [2^-6, 448].
    int64_t checked = 0;
    for (int32_t t = 0; t < c.tokens; ++t) {
      if (slots[static_cast<size_t>(t)] < 0) continue;
      for (int32_t h = 0; h < c.kv_heads; ++h) {
        for (int32_t d = 0; d < c.head_dim; ++d) {
          const size_t src = static_cast<size_t>(t) * row + static_cast<size_t>(h * c.head_dim + d);
          const int64_t v_at = layout.SlotOffset(1, 1, h, slots[static_cast<size_t>(t)]) + int64_t{d};
          const float x = v[src];
          const float scaled = std::fabs(x / v_scale[h]);
          if (!(scaled >= 0x1p-6f && scaled <= 448.0f)) continue;
          const float back = Fp8E4M3ToF32(static_cast<uint8_t>(gpu[static_cast<size_t>(v_at)])) * v_scale[h];
          ASSERT_LE(std::fabs(back - x), 0x1p-4f * std::fabs(x) * (1 + 1e-6f)) << "x " << x << " back " << back;
          ++checked;
        }
      }
    }
    EXPECT_GT(checked, 0);
  }
}

TEST(ReshapeAndCacheFp8KernelTest, RejectsBadShapesAndMissingScales) {
  // Argument checks happen before any launch, so they hold without a GPU too.
  const KvCacheShape shape{.num_kv_heads = 2, .head_dim = 64, .block_size_tokens = 16};
  const float scale = 1.0f;
  EXPECT_EQ(LaunchReshapeAndCacheFp8(nullptr, nullptr, nullptr, 1, shape, nullptr, &scale, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchReshapeAndCacheFp8(nullptr, nullptr, nullptr, 1, {.num_kv_heads = 2, .head_dim = 0},
                                     &scale, &scale, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchReshapeAndCacheFp8(nullptr, nullptr, nullptr, 0, shape, &scale, &scale, nullptr, nullptr),
            cudaSuccess);
}

}  // namespace
}  // namespace kvmesh::kernels
