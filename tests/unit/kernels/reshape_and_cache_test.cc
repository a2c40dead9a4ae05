// The CUDA reshape_and_cache kernel against the CPU backends' WriteKvCache, in a pool that
// kv::KvStorage lays out (two layers; the kernel writes layer 1), f32 and bf16 elements.
// The pool starts as random bytes, so the test also sees that nothing outside the written
// slots changes. Bitwise: a slot holds the f32 value, or F32ToBf16 of it (round to nearest
// even; the inputs include a tie, infinities and a NaN with a payload). Rows with slot -1
// are padding and are skipped. Skips where no GPU is present (CI), saying why.
#include "reshape_and_cache/reshape_and_cache.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "kv/kv_layout.h"

namespace kvmesh::kernels {
namespace {

using test_util::DeviceBuffer;

struct CacheCase {
  int32_t kv_heads, head_dim, block_size, tokens;
};

class ReshapeAndCacheKernelTest : public ::testing::TestWithParam<DType> {};

TEST_P(ReshapeAndCacheKernelTest, MatchesCpuBackendsBitForBit) {
  KVMESH_SKIP_WITHOUT_GPU();
  const DType dtype = GetParam();
  std::vector<std::unique_ptr<backend::Backend>> oracles;
  oracles.push_back(backend::CreateReferenceBackend());
  if (auto cpu = backend::CreateCpuBackend({}); cpu.ok()) oracles.push_back(std::move(cpu).value());
  for (const CacheCase& c : {CacheCase{1, 64, 16, 1}, CacheCase{2, 128, 16, 257}, CacheCase{8, 64, 5, 257},
                             CacheCase{4, 128, 16, 33}, CacheCase{8, 128, 32, 3}}) {
    SCOPED_TRACE(::testing::Message() << "Hkv " << c.kv_heads << " D " << c.head_dim << " B " << c.block_size
                                      << " T " << c.tokens);
    const int32_t num_blocks = (c.tokens + c.block_size - 1) / c.block_size + 3;
    auto storage = kv::KvStorage::Create({.num_layers = 2,
                                          .num_kv_heads = c.kv_heads,
                                          .head_dim = c.head_dim,
                                          .block_size_tokens = c.block_size,
                                          .dtype = dtype,
                                          .num_blocks = num_blocks})
                       .value();
    const kv::KvLayout& layout = storage->layout();
    std::mt19937 rng(static_cast<uint32_t>(c.kv_heads * 131 + c.head_dim + c.tokens));
    for (int64_t i = 0; i < storage->size_bytes(); ++i) storage->data()[i] = static_cast<std::byte>(rng());

    const size_t row = static_cast<size_t>(c.kv_heads) * static_cast<size_t>(c.head_dim);
    std::vector<float> k(row * static_cast<size_t>(c.tokens)), v(k.size());
    std::normal_distribution<float> normal;
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    k[0] = std::bit_cast<float>(0x3f808000u);  // halfway between two bf16 values: rounds to even
    v[0] = std::bit_cast<float>(0x7fa00001u);  // a NaN with a payload
    if (k.size() > 2) {
      k[1] = std::numeric_limits<float>::infinity();
      v[1] = -std::numeric_limits<float>::infinity();
      k[2] = std::bit_cast<float>(0x3f818000u);  // a tie that rounds up
    }
    std::vector<int64_t> all_slots(static_cast<size_t>(num_blocks) * static_cast<size_t>(c.block_size));
    std::iota(all_slots.begin(), all_slots.end(), 0);
    std::shuffle(all_slots.begin(), all_slots.end(), rng);
    std::vector<int64_t> slots(all_slots.begin(), all_slots.begin() + c.tokens);
    if (c.tokens > 2) slots[1] = -1;  // padding row

    DeviceBuffer<std::byte> dpool(std::vector<std::byte>(storage->data(), storage->data() + storage->size_bytes()));
    DeviceBuffer<float> dk(k), dv(v);
    DeviceBuffer<int64_t> dslots(slots);
    const KvCacheShape shape{.num_kv_heads = c.kv_heads, .head_dim = c.head_dim, .block_size_tokens = c.block_size};
    std::byte* layer1 = dpool.get() + layout.LayerBytes();
    const cudaError_t err =
        dtype == DType::kBF16
            ? LaunchReshapeAndCacheBf16(dk.get(), dv.get(), dslots.get(), c.tokens, shape,
                                        reinterpret_cast<uint16_t*>(layer1), nullptr)
            : LaunchReshapeAndCacheF32(dk.get(), dv.get(), dslots.get(), c.tokens, shape,
                                       reinterpret_cast<float*>(layer1), nullptr);
    ASSERT_EQ(err, cudaSuccess);
    const std::vector<std::byte> gpu = dpool.Download();

    // The oracles get only the rows with a slot (they know no padding).
    std::vector<float> k_kept, v_kept;
    std::vector<int64_t> slots_kept;
    for (size_t t = 0; t < slots.size(); ++t) {
      if (slots[t] < 0) continue;
      slots_kept.push_back(slots[t]);
      k_kept.insert(k_kept.end(), k.begin() + static_cast<ptrdiff_t>(t * row),
                    k.begin() + static_cast<ptrdiff_t>((t + 1) * row));
      v_kept.insert(v_kept.end(), v.begin() + static_cast<ptrdiff_t>(t * row),
                    v.begin() + static_cast<ptrdiff_t>((t + 1) * row));
    }
    const int64_t kept = static_cast<int64_t>(slots_kept.size());
    const std::vector<std::byte> initial(storage->data(), storage->data() + storage->size_bytes());
    for (const auto& oracle : oracles) {
      SCOPED_TRACE(oracle->name());
      std::memcpy(storage->data(), initial.data(), initial.size());
      oracle->WriteKvCache(TensorView::Contiguous(k_kept.data(), DType::kF32, {kept, c.kv_heads, c.head_dim}),
                           TensorView::Contiguous(v_kept.data(), DType::kF32, {kept, c.kv_heads, c.head_dim}),
                           slots_kept, storage->LayerView(1));
      ASSERT_EQ(std::memcmp(gpu.data(), storage->data(), gpu.size()), 0) << "pool bytes differ";
    }

    // And straight from kv_layout.h's offsets: token 0's K and V, every head and dimension.
    const int64_t esize = dtype == DType::kBF16 ? 2 : 4;
    for (int32_t h = 0; h < c.kv_heads; ++h) {
      for (int32_t d = 0; d < c.head_dim; ++d) {
        const size_t src = static_cast<size_t>(h) * static_cast<size_t>(c.head_dim) + static_cast<size_t>(d);
        const int64_t k_at = layout.SlotOffset(1, 0, h, slots[0]) + int64_t{d} * c.block_size * esize;
        const int64_t v_at = layout.SlotOffset(1, 1, h, slots[0]) + int64_t{d} * esize;
        for (auto [at, value] : {std::pair{k_at, k[src]}, std::pair{v_at, v[src]}}) {
          if (dtype == DType::kBF16) {
            uint16_t bits;
            std::memcpy(&bits, gpu.data() + at, 2);
            ASSERT_EQ(bits, F32ToBf16(value)) << "head " << h << " dim " << d;
          } else {
            uint32_t bits;
            std::memcpy(&bits, gpu.data() + at, 4);
            ASSERT_EQ(bits, std::bit_cast<uint32_t>(value)) << "head " << h << " dim " << d;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PoolDTypes, ReshapeAndCacheKernelTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return info.param == DType::kBF16 ? "Bf16" : "F32";
                         });

}  // namespace
}  // namespace kvmesh::kernels
