// Transport security of kvmesh's gRPC hops, decided once per process and applied in
// ONE place: every GrpcServer (grpc_server.h) and every CreateChannel (channel.h)
// take their credentials from here, so no service can open an insecure hop by
// forgetting a flag.
//
//   rpc::ConfigureTransportSecurity({.cert_file = "svc.pem", .key_file = "svc.key",
//                                    .ca_file = "ca.pem"});   // first thing in main()
//
// Not configured (the default): plaintext, as before. Configured: mutual TLS —
//   - service servers (scheduler, worker) present `cert_file` and refuse a peer
//     without a certificate signed by `ca_file`
//     (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
//   - channels present `cert_file` as their client certificate and verify the server's
//     against `ca_file` (and its name against the target host, or `server_name`);
//   - client-facing servers (the Inference API of the router and `kvmesh serve`,
//     GrpcServerOptions::peers = kClients) use TLS with `cert_file` but ask no client
//     certificate: clients authenticate with API keys.
//
// NOTE: this protects gRPC only. The UCX KV data plane (RDMA / TCP between workers)
// does not go through gRPC and is not encrypted or authenticated by it; it relies on
// the deployment's network policy keeping worker data ports reachable only from
// other workers (see README, "Security").
//
// Thread-safety: ConfigureTransportSecurity once, before any server or channel is
// made; the getters are thread-safe afterwards.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace grpc {
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace kvmesh::rpc {

struct TlsOptions {
  std::string cert_file;    // PEM certificate chain this process presents
  std::string key_file;     // PEM private key of cert_file
  std::string ca_file;      // PEM CA bundle peers' certificates must chain to
  std::string server_name;  // "": verify servers against the target's host
};

enum class PeerAuth {
  kServices,  // another kvmesh service: mutual TLS when configured
  kClients,   // end clients: server-side TLS when configured, no client certificate
};

// All three files or none. InvalidArgument naming the missing flag(s) when only some
// are given; NotFound / PermissionDenied naming a file that cannot be read.
absl::Status ConfigureTransportSecurity(const TlsOptions& options);

// True once configured with files.
bool TransportSecurityEnabled();

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(PeerAuth peers);
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials();
// The name to verify servers against ("" unless TlsOptions::server_name).
std::string TlsServerNameOverride();

}  // namespace kvmesh::rpc
