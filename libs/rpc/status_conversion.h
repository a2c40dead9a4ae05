// The one place where absl::Status and grpc::Status are converted (docs/development.md,
// "Conventions": a Status becomes gRPC in exactly one place). Codes map one to one (both follow
// google.rpc.Code); the message is kept; an out-of-range code becomes UNKNOWN.
//
// Thread-safety: pure functions.
#pragma once

#include "absl/status/status.h"

namespace grpc {
class Status;
class ServerUnaryReactor;
class CallbackServerContext;
}  // namespace grpc

namespace kvmesh::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Finishes a unary callback-API call with `status`: the body of a thin service method
// that has already filled its response. Returns the reactor gRPC expects back.
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, const absl::Status& status);

}  // namespace kvmesh::rpc
