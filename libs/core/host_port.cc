#include "core/host_port.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvmesh {
namespace {

absl::string_view View(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

absl::Status CheckPort(int64_t port, std::string_view what) {
  if (port < 0 || port > kMaxPort) {
    return absl::InvalidArgumentError(
        absl::StrCat(View(what), ": port ", port, " is out of range [0, ", kMaxPort, "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<HostPort> ParseHostPort(std::string_view address) {
  const auto invalid = [address](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("address \"", View(address), "\": ", View(why)));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return invalid("expected host:port");
  std::string_view host = address.substr(0, colon);
  const std::string_view port_text = address.substr(colon + 1);
  if (!host.empty() && host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return invalid("an IPv6 host needs [brackets]");
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return invalid("an IPv6 host needs [brackets]");
  }
  if (host.empty()) return invalid("the host is empty");
  if (port_text.empty() || port_text.size() > 10) return invalid("the port must be a decimal number");
  for (const char c : port_text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return invalid("the port must be a decimal number");
  }
  int64_t port = 0;
  if (!absl::SimpleAtoi(View(port_text), &port)) return invalid("the port must be a decimal number");
  if (port > kMaxPort) {
    return invalid(absl::StrCat("port ", port, " is out of range [0, ", kMaxPort, "]"));
  }
  return HostPort{.host = std::string(host), .port = static_cast<int32_t>(port)};
}

}  // namespace kvmesh
