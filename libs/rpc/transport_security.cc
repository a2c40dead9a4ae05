#include "rpc/transport_security.h"

#include <mutex>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"

namespace kvmesh::rpc {
namespace {

struct Pem {
  std::string cert;
  std::string key;
  std::string ca;
  std::string server_name;
};

std::mutex& Mutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
// Null: plaintext. Never freed (read by servers and channels until exit).
const Pem*& Configured() {
  static const Pem* pem = nullptr;
  return pem;
}

const Pem* Current() {
  std::lock_guard<std::mutex> lock(Mutex());
  return Configured();
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat(flag, ": ", text.status().message()));
  if (text->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is not a PEM file"));
  }
  return text;
}

}  // namespace

absl::Status ConfigureTransportSecurity(const TlsOptions& options) {
  const int given = !options.cert_file.empty() + !options.key_file.empty() + !options.ca_file.empty();
  if (given == 0) return absl::OkStatus();
  if (given != 3) {
    return absl::InvalidArgumentError(
        "mutual TLS needs all of --tls-cert, --tls-key and --tls-ca (or none of them)");
  }
  auto pem = std::make_unique<Pem>();
  absl::StatusOr<std::string> cert = ReadPem(options.cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(options.key_file, "--tls-key");
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> ca = ReadPem(options.ca_file, "--tls-ca");
  if (!ca.ok()) return ca.status();
  pem->cert = *std::move(cert);
  pem->key = *std::move(key);
  pem->ca = *std::move(ca);
  pem->server_name = options.server_name;
  std::lock_guard<std::mutex> lock(Mutex());
  delete Configured();  // a reconfiguration (tests) replaces the old one
  Configured() = pem.release();
  return absl::OkStatus();
}

bool TransportSecurityEnabled() { return Current() != nullptr; }

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(PeerAuth peers) {
  const Pem* pem = Current();
  if (pem == nullptr) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(peers == PeerAuth::kServices
                                                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = pem->ca;
  options.pem_key_cert_pairs.push_back({pem->key, pem->cert});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() {
  const Pem* pem = Current();
  if (pem == nullptr) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = pem->ca;
  options.pem_private_key = pem->key;
  options.pem_cert_chain = pem->cert;
  return grpc::SslCredentials(options);
}

std::string TlsServerNameOverride() {
  const Pem* pem = Current();
  return pem == nullptr ? "" : pem->server_name;
}

}  // namespace kvmesh::rpc
