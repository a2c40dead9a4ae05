#include "kv/streaming_copy.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace kvmesh::kv {
namespace {

std::vector<std::byte> Pattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + static_cast<size_t>(seed) * 7) & 0xff);
  return v;
}

// The streamed path (aligned, whole 64-byte lines) and the memcpy fallback (unaligned
// or ragged sizes) both copy exactly `bytes` and nothing around them.
TEST(StreamingCopyTest, CopiesExactlyTheRangeAlignedOrNot) {
  for (size_t bytes : {size_t{64}, size_t{4096}, size_t{8192 + 64}, size_t{100}, size_t{0}}) {
    for (size_t dst_offset : {size_t{0}, size_t{16}, size_t{3}}) {
      for (size_t src_offset : {size_t{0}, size_t{32}, size_t{5}}) {
        const std::vector<std::byte> src = Pattern(bytes + 128, 1);
        alignas(64) std::byte dst_buf[8192 + 64 + 256];
        std::memset(dst_buf, 0xee, sizeof(dst_buf));
        alignas(64) std::byte src_buf[8192 + 64 + 256];
        std::memcpy(src_buf + src_offset, src.data(), bytes);
        StreamingCopy(dst_buf + 64 + dst_offset, src_buf + src_offset, bytes, /*prefetch_next=*/src_buf);
        StreamingCopyFence();
        ASSERT_EQ(std::memcmp(dst_buf + 64 + dst_offset, src.data(), bytes), 0) << bytes << " " << dst_offset;
        for (size_t i = 0; i < 64 + dst_offset; ++i) ASSERT_EQ(dst_buf[i], std::byte{0xee}) << "before " << i;
        for (size_t i = 64 + dst_offset + bytes; i < sizeof(dst_buf); ++i) {
          ASSERT_EQ(dst_buf[i], std::byte{0xee}) << "after " << i;
        }
      }
    }
  }
}

// A list of scattered copies, each prefetching the next one's source, lands every byte.
TEST(StreamingCopyTest, APipelineOfScatteredCopiesLandsEveryByte) {
  constexpr size_t kChunk = 8192, kChunks = 16;
  const std::vector<std::byte> src = Pattern(kChunk * kChunks, 2);
  std::vector<std::byte> dst(kChunk * kChunks + 64);
  std::byte* base = dst.data() + (64 - reinterpret_cast<uintptr_t>(dst.data()) % 64) % 64;
  for (size_t c = 0; c < kChunks; ++c) {
    const size_t from = (c * 5) % kChunks;  // a permutation of the chunks
    const std::byte* next = c + 1 < kChunks ? src.data() + ((c + 1) * 5 % kChunks) * kChunk : nullptr;
    StreamingCopy(base + c * kChunk, src.data() + from * kChunk, kChunk, next);
  }
  StreamingCopyFence();
  for (size_t c = 0; c < kChunks; ++c) {
    ASSERT_EQ(std::memcmp(base + c * kChunk, src.data() + ((c * 5) % kChunks) * kChunk, kChunk), 0) << c;
  }
}

}  // namespace
}  // namespace kvmesh::kv
