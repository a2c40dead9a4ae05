// The KV-cache write kernel's own code (reshape_and_cache_kernel.cuh) on the host emulation,
// with the launcher's grid, in a pool kv::KvStorage lays out (two layers of random bytes; the
// kernel writes layer 1), as reshape_and_cache_test and reshape_and_cache_fp8_test: f32 and
// bf16 pools against the CPU backends' WriteKvCache, an FP8 e4m3 pool with per-head scales
// against core/dtype.h's F32ToFp8E4M3(x / scale) at kv_layout.h's offsets; bit for bit, every
// byte not written unchanged, slot -1 rows skipped. Inputs include bf16 ties, infinities, a
// NaN with a payload, values that saturate e4m3 and one that underflows.
#include "host_emulation/prelude.h"

#include "reshape_and_cache/reshape_and_cache_kernel.cuh"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/tensor_view.h"
#include "emulation_test_util.h"
#include "host_emulation/grid.h"
#include "kv/kv_layout.h"

namespace kvmesh::kernels {
namespace {

struct CacheCase {
  int32_t kv_heads, head_dim, block_size, tokens;
};

constexpr CacheCase kCases[] = {{1, 64, 16, 1}, {2, 16, 5, 7}, {3, 8, 4, 5}};

// A two-layer pool of random bytes and a write of `c.tokens` random rows to random slots of
// layer 1 (one row padding where there are enough), with special values in the first rows.
struct CacheWrite {
  std::unique_ptr<kv::KvStorage> storage;
  std::vector<std::byte> initial;
  std::vector<float> k, v, k_scale, v_scale;
  std::vector<int64_t> slots;
};

CacheWrite RandomWrite(const CacheCase& c, DType dtype) {
  const int32_t num_blocks = (c.tokens + c.block_size - 1) / c.block_size + 3;
  CacheWrite w;
  std::mt19937 rng(static_cast<uint32_t>(c.kv_heads * 131 + c.head_dim + c.tokens));
  w.storage = emulation_test::RandomKvStorage({.num_layers = 2, .num_kv_heads = c.kv_heads, .head_dim = c.head_dim,
                                               .block_size_tokens = c.block_size, .dtype = dtype,
                                               .num_blocks = num_blocks},
                                              rng);
  w.initial.assign(w.storage->data(), w.storage->data() + w.storage->size_bytes());
  const size_t n = static_cast<size_t>(c.kv_heads) * static_cast<size_t>(c.head_dim) * static_cast<size_t>(c.tokens);
  const float stddev = dtype == DType::kFP8E4M3 ? 8.f : 1.f;
  w.k = emulation_test::RandomNormal(n, static_cast<uint32_t>(rng()), stddev);
  w.v = emulation_test::RandomNormal(n, static_cast<uint32_t>(rng()), stddev);
  std::uniform_real_distribution<float> scale(0.01f, 0.3f);
  for (int32_t h = 0; h < c.kv_heads; ++h) {
    w.k_scale.push_back(scale(rng));
    w.v_scale.push_back(scale(rng));
  }
  w.k[0] = dtype == DType::kFP8E4M3 ? 1000.0f : std::bit_cast<float>(0x3f808000u);  // saturates / a bf16 tie
  w.v[0] = std::bit_cast<float>(0x7fa00001u);                                       // a NaN with a payload
  if (n > 2) {
    w.k[1] = std::numeric_limits<float>::infinity();
    w.v[1] = -std::numeric_limits<float>::infinity();
    w.k[2] = dtype == DType::kFP8E4M3 ? 1e-6f : std::bit_cast<float>(0x3f818000u);  // underflows / rounds up
  }
  std::vector<int64_t> all_slots(static_cast<size_t>(num_blocks) * static_cast<size_t>(c.block_size));
  std::iota(all_slots.begin(), all_slots.end(), 0);
  std::shuffle(all_slots.begin(), all_slots.end(), rng);
  w.slots.assign(all_slots.begin(), all_slots.begin() + c.tokens);
  if (c.tokens > 2) w.slots[1] = -1;  // padding row
  return w;
}

template <typename T>
void EmulateWrite(const CacheCase& c, CacheWrite& w, bool scaled) {
  const KvCacheShape shape{.num_kv_heads = c.kv_heads, .head_dim = c.head_dim, .block_size_tokens = c.block_size};
  T* layer1 = reinterpret_cast<T*>(w.storage->data() + w.storage->layout().LayerBytes());
  host_emulation::EmulateGrid(reshape_and_cache::ReshapeAndCacheGrid(c.tokens), reshape_and_cache::kThreads, [&] {
    reshape_and_cache::ReshapeAndCacheKernel<T>(w.k.data(), w.v.data(), w.slots.data(), shape,
                                                scaled ? w.k_scale.data() : nullptr,
                                                scaled ? w.v_scale.data() : nullptr, layer1);
  });
}

TEST(ReshapeAndCacheEmulationKernelTest, F32AndBf16PoolsMatchCpuBackendsBitForBit) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const CacheCase& c : kCases) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " Hkv " << c.kv_heads << " D " << c.head_dim << " B "
                                        << c.block_size << " T " << c.tokens);
      CacheWrite w = RandomWrite(c, dtype);
      if (dtype == DType::kBF16) {
        EmulateWrite<uint16_t>(c, w, false);
      } else {
        EmulateWrite<float>(c, w, false);
      }
      const std::vector<std::byte> got(w.storage->data(), w.storage->data() + w.storage->size_bytes());
      // The oracles get only the rows with a slot (they know no padding).
      const size_t row = static_cast<size_t>(c.kv_heads) * static_cast<size_t>(c.head_dim);
      std::vector<float> k_kept, v_kept;
      std::vector<int64_t> slots_kept;
      for (size_t t = 0; t < w.slots.size(); ++t) {
        if (w.slots[t] < 0) continue;
        slots_kept.push_back(w.slots[t]);
        k_kept.insert(k_kept.end(), w.k.begin() + static_cast<ptrdiff_t>(t * row),
                      w.k.begin() + static_cast<ptrdiff_t>((t + 1) * row));
        v_kept.insert(v_kept.end(), w.v.begin() + static_cast<ptrdiff_t>(t * row),
                      w.v.begin() + static_cast<ptrdiff_t>((t + 1) * row));
      }
      const int64_t kept = static_cast<int64_t>(slots_kept.size());
      for (const auto& oracle : emulation_test::Oracles()) {
        SCOPED_TRACE(oracle->name());
        std::memcpy(w.storage->data(), w.initial.data(), w.initial.size());
        oracle->WriteKvCache(TensorView::Contiguous(k_kept.data(), DType::kF32, {kept, c.kv_heads, c.head_dim}),
                             TensorView::Contiguous(v_kept.data(), DType::kF32, {kept, c.kv_heads, c.head_dim}),
                             slots_kept, w.storage->LayerView(1));
        ASSERT_EQ(std::memcmp(got.data(), w.storage->data(), got.size()), 0) << "pool bytes differ";
      }
    }
  }
}

TEST(ReshapeAndCacheEmulationKernelTest, Fp8PoolMatchesHostE4M3BitForBit) {
  for (const CacheCase& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "Hkv " << c.kv_heads << " D " << c.head_dim << " B " << c.block_size
                                      << " T " << c.tokens);
    CacheWrite w = RandomWrite(c, DType::kFP8E4M3);
    EmulateWrite<uint8_t>(c, w, true);
    const kv::KvLayout& layout = w.storage->layout();
    std::vector<std::byte> expected = w.initial;
    const size_t row = static_cast<size_t>(c.kv_heads) * static_cast<size_t>(c.head_dim);
    for (size_t t = 0; t < w.slots.size(); ++t) {
      if (w.slots[t] < 0) continue;
      for (int32_t h = 0; h < c.kv_heads; ++h) {
        for (int32_t d = 0; d < c.head_dim; ++d) {
          const size_t src = t * row + static_cast<size_t>(h * c.head_dim + d);
          const int64_t k_at = layout.SlotOffset(1, 0, h, w.slots[t]) + int64_t{d} * c.block_size;
          const int64_t v_at = layout.SlotOffset(1, 1, h, w.slots[t]) + int64_t{d};
          expected[static_cast<size_t>(k_at)] =
              static_cast<std::byte>(F32ToFp8E4M3(w.k[src] / w.k_scale[static_cast<size_t>(h)]));
          expected[static_cast<size_t>(v_at)] =
              static_cast<std::byte>(F32ToFp8E4M3(w.v[src] / w.v_scale[static_cast<size_t>(h)]));
        }
      }
    }
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_EQ(static_cast<int>(w.storage->data()[i]), static_cast<int>(expected[i]))
          << "pool byte " << i << (expected[i] == w.initial[i] ? " (must be untouched)" : " (written)");
    }
  }
}

}  // namespace
}  // namespace kvmesh::kernels
