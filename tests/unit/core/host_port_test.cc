#include "core/host_port.h"

#include <gtest/gtest.h>

namespace kvmesh {
namespace {

TEST(HostPortTest, ParsesHostsIpv6InBracketsAndPortsUpTo65535) {
  absl::StatusOr<HostPort> a = ParseHostPort("0.0.0.0:50052");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "0.0.0.0");
  EXPECT_EQ(a->port, 50052);
  absl::StatusOr<HostPort> b = ParseHostPort("[::1]:0");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 0);
  EXPECT_EQ(ParseHostPort("localhost:65535")->port, 65535);
}

TEST(HostPortTest, RefusesPortsThatWouldWrapAndMalformedAddresses) {
  const absl::Status wrap = ParseHostPort("127.0.0.1:99999").status();
  EXPECT_EQ(wrap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wrap.message(), "address \"127.0.0.1:99999\": port 99999 is out of range [0, 65535]");
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", ":80", "host:-1", "host:8o", "::1:80", "[::1:80",
                          "host:99999999999999999999"}) {
    EXPECT_EQ(ParseHostPort(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(HostPortTest, CheckPortNamesWhatItChecks) {
  EXPECT_TRUE(CheckPort(0, "--port").ok());
  EXPECT_EQ(CheckPort(80000, "--port").message(), "--port: port 80000 is out of range [0, 65535]");
}

}  // namespace
}  // namespace kvmesh
