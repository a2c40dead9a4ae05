#include "core/api_key.h"

#include <cstdint>

namespace kvmesh {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Volatile: keeps the compiler from turning the loop into an early-exit memcmp.
  volatile uint8_t diff = a.size() == b.size() ? 0 : 1;
  const size_t n = a.size();
  for (size_t i = 0; i < b.size(); ++i) {
    const uint8_t x = n == 0 ? 0 : static_cast<uint8_t>(a[i % n]);
    diff = diff | static_cast<uint8_t>(x ^ static_cast<uint8_t>(b[i]));
  }
  return diff == 0;
}

std::optional<std::string> MatchBearerKey(std::string_view authorization, const std::vector<std::string>& keys) {
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.substr(0, kBearer.size()) != kBearer) return std::nullopt;
  const std::string_view presented = authorization.substr(kBearer.size());
  std::optional<std::string> match;
  for (const std::string& key : keys) {  // all of them: no early exit on a match either
    if (ConstantTimeEquals(presented, key) && !match) match = key;
  }
  return match;
}

}  // namespace kvmesh
