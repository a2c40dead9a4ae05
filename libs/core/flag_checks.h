// Value checks of command-line flags, declared beside the flag and enforced by the one
// parser every kvmesh binary uses (ParseServiceCommandLine, the kvmesh CLI's
// ParseSubcommandFlags), after the KVMESH_<FLAG> defaults and the command line:
//
//   ABSL_FLAG(int, port, 8000, "REST port; 0 picks a free one");
//   KVMESH_FLAG_RANGE(port, 0, 65535);
//   ABSL_FLAG(std::string, listen, "0.0.0.0:50052", "gRPC address (host:port)");
//   KVMESH_FLAG_ADDRESS(listen);
//
// A value out of range is refused with a message naming the flag ("--port=80000 is out
// of range [0, 65535]") and the binary exits with status 2, rather than wrapping later
// (a port is 16 bits). NOTE: every numeric flag (integer or floating point) of a binary
// must have a range: CheckFlags reports one without as a programmer error, so a new
// flag cannot skip its check.
//
// Thread-safety: registration happens during static initialisation; CheckFlags is
// called once from main(), before other threads start.
#pragma once

#include <functional>
#include <string_view>

#include "absl/flags/commandlineflag.h"
#include "absl/status/status.h"

namespace kvmesh {

// Registers [min, max] (inclusive) for the numeric flag `name`.
struct FlagRangeRegistrar {
  FlagRangeRegistrar(const char* name, double min, double max);
};
// Registers a "host:port" check (core/host_port.h) for the string flag `name`; an empty
// value passes (the binary decides whether the flag is required), and so do gRPC target
// schemes ("dns:///host:port" is checked after the scheme, "unix:/path" passes).
struct FlagAddressRegistrar {
  explicit FlagAddressRegistrar(const char* name);
};

// Checks every flag for which `is_ours` is true: InvalidArgument naming the first flag
// whose value is out of its range or not an address, Internal naming a numeric flag
// that has no registered range.
absl::Status CheckFlags(const std::function<bool(const absl::CommandLineFlag&)>& is_ours);

}  // namespace kvmesh

#define KVMESH_FLAG_RANGE(name, min, max) \
  static const ::kvmesh::FlagRangeRegistrar kvmesh_flag_range_##name(#name, (min), (max))
#define KVMESH_FLAG_ADDRESS(name) static const ::kvmesh::FlagAddressRegistrar kvmesh_flag_address_##name(#name)
