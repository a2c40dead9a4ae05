// The block-swap tests' inputs and host oracle (swap_blocks_test on the GPU, the host
// emulation test without one): random pool bytes, shuffled (src, dst) pairs, and the
// destination pool a swap must leave.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "copy_blocks/copy_blocks.h"

namespace kvmesh::kernels::test_util {

inline std::vector<std::byte> RandomBytes(size_t n, std::mt19937& rng) {
  std::vector<std::byte> out(n);
  for (std::byte& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// `n` pairs (src, dst): distinct random src ids below src_blocks, distinct random dst ids
// below dst_blocks.
inline std::vector<int32_t> ShuffledPairs(int32_t n, int32_t src_blocks, int32_t dst_blocks, std::mt19937& rng) {
  std::vector<int32_t> src(static_cast<size_t>(src_blocks)), dst(static_cast<size_t>(dst_blocks));
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<int32_t> pairs;
  for (int32_t i = 0; i < n; ++i) {
    pairs.push_back(src[static_cast<size_t>(i)]);
    pairs.push_back(dst[static_cast<size_t>(i)]);
  }
  return pairs;
}

// What the swap must leave in `dst`: `dst` with each pair's block copied over, every layer.
inline std::vector<std::byte> ExpectedAfterSwap(const std::vector<std::byte>& src, const BlockPoolShape& src_shape,
                                                std::vector<std::byte> dst, const BlockPoolShape& dst_shape,
                                                const std::vector<int32_t>& pairs) {
  for (int64_t layer = 0; layer < src_shape.num_layers; ++layer) {
    for (size_t p = 0; p + 1 < pairs.size(); p += 2) {
      std::memcpy(dst.data() + layer * dst_shape.layer_bytes + pairs[p + 1] * dst_shape.block_bytes,
                  src.data() + layer * src_shape.layer_bytes + pairs[p] * src_shape.block_bytes,
                  static_cast<size_t>(src_shape.block_bytes));
    }
  }
  return dst;
}

// One swap test case: a block size and how many blocks each side holds, and how many pairs.
struct SwapCase {
  int64_t block_bytes;
  int32_t device_blocks, host_blocks, pairs;
};

// Two-layer device and host pools of `c`'s sizes, their bytes random.
struct SwapPools {
  BlockPoolShape device_shape, host_shape;
  std::vector<std::byte> device_initial, host_initial;
};

inline SwapPools RandomSwapPools(const SwapCase& c, std::mt19937& rng) {
  SwapPools p{.device_shape = {.num_layers = 2, .layer_bytes = c.block_bytes * c.device_blocks,
                               .block_bytes = c.block_bytes},
              .host_shape = {.num_layers = 2, .layer_bytes = c.block_bytes * c.host_blocks,
                             .block_bytes = c.block_bytes}};
  p.device_initial = RandomBytes(static_cast<size_t>(2 * p.device_shape.layer_bytes), rng);
  p.host_initial = RandomBytes(static_cast<size_t>(2 * p.host_shape.layer_bytes), rng);
  return p;
}

}  // namespace kvmesh::kernels::test_util
