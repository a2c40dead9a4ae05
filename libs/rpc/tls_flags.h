// --tls-cert, --tls-key, --tls-ca and --tls-server-name: the transport-security flags of
// every kvmesh service binary (scheduler, router, workers), defined once here and
// applied by ConfigureTransportSecurityFromFlags(). A separate library so that
// libraries using libs/rpc do not pull in Abseil's flags. --help lists this file as
// "tls_flags".
//
// Thread-safety: call once from main(), after flag parsing, before any server or channel.
#pragma once

#include "absl/status/status.h"

namespace kvmesh::rpc {

inline constexpr char kTlsFlagsFile[] = "tls_flags";

// ConfigureTransportSecurity with the flags' files (transport_security.h).
absl::Status ConfigureTransportSecurityFromFlags();

}  // namespace kvmesh::rpc
