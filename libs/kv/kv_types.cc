#include "kv/kv_types.h"

#include <cstdio>

namespace kvmesh::kv {

const char* TierName(Tier tier) {
  switch (tier) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kDisk: return "disk";
    case Tier::kStore: return "store";
  }
  return "unknown";
}

std::string BlockHash::ToHex() const {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return std::string(buf, 32);
}

}  // namespace kvmesh::kv
