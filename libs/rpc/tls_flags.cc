#include "rpc/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "rpc/transport_security.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate this service presents on every gRPC hop to other services (with --tls-key and "
          "--tls-ca: mutual TLS; peers without a certificate signed by --tls-ca are refused).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert.");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle that peers' certificates must chain to.");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name to verify servers' certificates against instead of the target's host (e.g. one name for a "
          "whole cluster).");

namespace kvmesh::rpc {

absl::Status ConfigureTransportSecurityFromFlags() {
  return ConfigureTransportSecurity({.cert_file = absl::GetFlag(FLAGS_tls_cert),
                                     .key_file = absl::GetFlag(FLAGS_tls_key),
                                     .ca_file = absl::GetFlag(FLAGS_tls_ca),
                                     .server_name = absl::GetFlag(FLAGS_tls_server_name)});
}

}  // namespace kvmesh::rpc
