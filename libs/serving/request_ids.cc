#include "serving/request_ids.h"

#include <array>
#include <chrono>
#include <random>

namespace kvmesh::serving {

std::string NewResponseId(std::string_view prefix) {
  // Seeded once per thread from the OS (std::random_device reads /dev/urandom or
  // RDRAND), with 256 bits of seed so that the 128 bits drawn are not limited by it.
  thread_local std::mt19937_64 generator = [] {
    std::random_device device;
    std::array<std::seed_seq::result_type, 8> seed;
    for (auto& word : seed) word = device();
    std::seed_seq sequence(seed.begin(), seed.end());
    return std::mt19937_64(sequence);
  }();
  constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  for (int word = 0; word < 2; ++word) {
    uint64_t bits = generator();
    for (int i = 0; i < 16; ++i, bits >>= 4) id.push_back(kHex[bits & 0xf]);
  }
  return id;
}

int64_t UnixSecondsNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace kvmesh::serving
