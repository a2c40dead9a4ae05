#include "kv/checksum.h"

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvmesh::kv {
namespace {

std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (std::byte& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// The reference: libxxhash's own entry point (baseline build, no dispatch). Records on
// disk written by either must verify with the other.
TEST(ChecksumTest, EqualsLibxxhashXxh3OnEverySize) {
  for (const size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{240}, size_t{4096}, size_t{12288},
                         size_t{368640}, size_t{1} << 22}) {
    const std::vector<std::byte> bytes = RandomBytes(n, static_cast<uint32_t>(n));
    EXPECT_EQ(Checksum(bytes), XXH3_64bits(bytes.data(), bytes.size())) << n << " bytes";
  }
}

TEST(ChecksumTest, StreamOverSlicesEqualsOneShot) {
  // 30 layer slices of 12 KiB, as KvStorage::SwapOut hashes a SmolLM2-shaped block.
  const std::vector<std::byte> bytes = RandomBytes(30 * 12288, 7);
  ChecksumStream stream;
  for (size_t at = 0; at < bytes.size(); at += 12288) stream.Update(bytes.data() + at, 12288);
  EXPECT_EQ(stream.Digest(), Checksum(bytes));
  ChecksumStream empty;
  EXPECT_EQ(empty.Digest(), Checksum({}));
}

TEST(ChecksumTest, OneFlippedBitChangesIt) {
  std::vector<std::byte> bytes = RandomBytes(368640, 3);
  const uint64_t before = Checksum(bytes);
  bytes[200000] ^= std::byte{0x10};
  EXPECT_NE(Checksum(bytes), before);
}

}  // namespace
}  // namespace kvmesh::kv
