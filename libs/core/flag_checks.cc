#include "core/flag_checks.h"

#include <limits>
#include <map>
#include <string>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/host_port.h"

namespace kvmesh {
namespace {

struct Range {
  double min = 0;
  double max = 0;
};

// Function-local statics: the registrars run during static initialisation, in any order.
std::map<std::string, Range>& Ranges() {
  static auto* ranges = new std::map<std::string, Range>();
  return *ranges;
}
std::map<std::string, bool>& Addresses() {
  static auto* addresses = new std::map<std::string, bool>();
  return *addresses;
}

bool IsIntegral(const absl::CommandLineFlag& flag) {
  return flag.IsOfType<int32_t>() || flag.IsOfType<int64_t>() || flag.IsOfType<uint32_t>() ||
         flag.IsOfType<uint64_t>() || flag.IsOfType<int16_t>() || flag.IsOfType<uint16_t>();
}
bool IsNumeric(const absl::CommandLineFlag& flag) {
  return IsIntegral(flag) || flag.IsOfType<double>() || flag.IsOfType<float>();
}

// "65535" for integral bounds, "0.5" otherwise.
std::string Bound(double v, bool integral) {
  if (!integral) return absl::StrCat(v);
  // Bounds at the int64 limits do not round-trip through double: name them exactly.
  if (v >= 9.2233720368547758e18) return absl::StrCat(std::numeric_limits<int64_t>::max());
  if (v <= -9.2233720368547758e18) return absl::StrCat(std::numeric_limits<int64_t>::min());
  return absl::StrCat(static_cast<int64_t>(v));
}

absl::Status CheckRange(const absl::CommandLineFlag& flag, const Range& range) {
  const std::string value = flag.CurrentValue();
  double v = 0;
  if (!absl::SimpleAtod(value, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag.Name(), "=", value, " is not a number"));
  }
  if (!(v >= range.min && v <= range.max)) {  // also refuses NaN
    const bool integral = IsIntegral(flag);
    return absl::InvalidArgumentError(absl::StrCat("--", flag.Name(), "=", value, " is out of range [",
                                                   Bound(range.min, integral), ", ", Bound(range.max, integral),
                                                   "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckAddress(const absl::CommandLineFlag& flag) {
  const std::string value = flag.CurrentValue();
  if (value.empty() || absl::StartsWith(value, "unix:")) return absl::OkStatus();
  absl::string_view address = value;
  for (absl::string_view scheme : {"dns:///", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&address, scheme)) break;
  }
  if (absl::StatusOr<HostPort> parsed = ParseHostPort(std::string_view(address.data(), address.size()));
      !parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag.Name(), ": ", parsed.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace

FlagRangeRegistrar::FlagRangeRegistrar(const char* name, double min, double max) { Ranges()[name] = {min, max}; }

FlagAddressRegistrar::FlagAddressRegistrar(const char* name) { Addresses()[name] = true; }

absl::Status CheckFlags(const std::function<bool(const absl::CommandLineFlag&)>& is_ours) {
  // Sorted by name, so that the first error reported does not depend on hash order.
  std::map<std::string, const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (is_ours(*flag)) flags.emplace(std::string(name), flag);
  }
  for (const auto& [name, flag] : flags) {
    if (Addresses().count(name) > 0) {
      if (absl::Status s = CheckAddress(*flag); !s.ok()) return s;
      continue;
    }
    if (!IsNumeric(*flag)) continue;
    const auto range = Ranges().find(name);
    if (range == Ranges().end()) {
      return absl::InternalError(absl::StrCat("numeric flag --", name, " (", flag->Filename(),
                                              ") has no KVMESH_FLAG_RANGE"));
    }
    if (absl::Status s = CheckRange(*flag, range->second); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace kvmesh
