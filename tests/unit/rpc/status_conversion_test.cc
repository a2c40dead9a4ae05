#include "rpc/status_conversion.h"

#include <grpcpp/support/status.h>
#include <gtest/gtest.h>

namespace kvmesh::rpc {
namespace {

TEST(StatusConversionTest, EveryCodeRoundTripsWithItsMessage) {
  for (int code = 0; code <= 16; ++code) {
    const auto absl_code = static_cast<absl::StatusCode>(code);
    const absl::Status status(absl_code, code == 0 ? "" : "what went wrong");
    const grpc::Status grpc_status = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(grpc_status.error_code()), code) << absl::StatusCodeToString(absl_code);
    EXPECT_EQ(grpc_status.error_message(), code == 0 ? "" : "what went wrong");
    EXPECT_EQ(FromGrpcStatus(grpc_status), status) << absl::StatusCodeToString(absl_code);
  }
}

TEST(StatusConversionTest, NamedCodesMapToTheirGrpcNames) {
  EXPECT_EQ(ToGrpcStatus(absl::DataLossError("checksum")).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("down")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("full")).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "x")).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "x")).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(StatusConversionTest, OutOfRangeCodesBecomeUnknown) {
  EXPECT_EQ(ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(42), "odd")).error_code(),
            grpc::StatusCode::UNKNOWN);
  // 20: no code gRPC names, but inside grpc::StatusCode's range of values (0..31: an enum
  // without a fixed type holds what its enumerators' bits hold); 42 would be UB (UBSan).
  EXPECT_EQ(FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(20), "odd")).code(), absl::StatusCode::kUnknown);
}

}  // namespace
}  // namespace kvmesh::rpc
