#include "rpc/channel.h"

#include <chrono>
#include <string>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/strings/str_cat.h"
#include "rpc/transport_security.h"

namespace kvmesh::rpc {

std::shared_ptr<grpc::Channel> CreateChannel(std::string_view target, const ChannelOptions& options) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, options.keepalive_permit_without_calls ? 1 : 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, options.initial_reconnect_backoff_ms);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, options.connect_timeout_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, options.max_reconnect_backoff_ms);
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  args.SetMaxSendMessageSize(options.max_send_message_bytes);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, options.enable_retries ? 1 : 0);
  if (const std::string name = TlsServerNameOverride(); !name.empty()) {
    args.SetSslTargetNameOverride(name);
  }
  return grpc::CreateCustomChannel(std::string(target), ChannelCredentials(), args);
}

absl::Status WaitForConnected(grpc::Channel& channel, int64_t timeout_ms) {
  const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms);
  if (channel.WaitForConnected(deadline)) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat("channel not connected after ", timeout_ms, " ms"));
}

void SetTimeout(grpc::ClientContext* context, int64_t timeout_ms) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
}

}  // namespace kvmesh::rpc
