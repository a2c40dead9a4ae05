#include "core/command_line.h"

#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/flags/flag.h"
#include "core/flag_checks.h"

ABSL_FLAG(int, command_line_test_port, 1, "A flag of this test file.");
KVMESH_FLAG_RANGE(command_line_test_port, 0, 65535);
ABSL_FLAG(std::string, command_line_test_name, "default", "Another flag of this test file.");
ABSL_FLAG(std::string, command_line_test_listen, "127.0.0.1:0", "An address flag of this test file.");
KVMESH_FLAG_ADDRESS(command_line_test_listen);

namespace kvmesh {
namespace {

void Parse(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ParseServiceCommandLine(static_cast<int>(argv.size()), argv.data(),
                          {.program = "test", .usage = "test usage", .flags_path = "command_line_test"});
}

TEST(CommandLineTest, DashesEnvironmentDefaultsAndTheCommandLineOverridingThem) {
  setenv("KVMESH_COMMAND_LINE_TEST_NAME", "from-env", 1);
  setenv("KVMESH_COMMAND_LINE_TEST_PORT", "7", 1);
  Parse({"prog", "--command-line-test-port=9"});
  EXPECT_EQ(absl::GetFlag(FLAGS_command_line_test_port), 9);  // the command line wins
  EXPECT_EQ(absl::GetFlag(FLAGS_command_line_test_name), "from-env");
  unsetenv("KVMESH_COMMAND_LINE_TEST_NAME");
  unsetenv("KVMESH_COMMAND_LINE_TEST_PORT");
}

TEST(CommandLineTest, NormalizeFlagNameReplacesDashesInTheNameOnly) {
  EXPECT_EQ(NormalizeFlagName("--max-tokens=a-b"), "--max_tokens=a-b");
  EXPECT_EQ(NormalizeFlagName("--kv-cache-bytes"), "--kv_cache_bytes");
  EXPECT_EQ(NormalizeFlagName("-x-y"), "-x-y");
  EXPECT_EQ(NormalizeFlagName("plain-arg"), "plain-arg");
}

TEST(CommandLineDeathTest, PositionalArgumentsAndBadEnvironmentValuesExitWithTwo) {
  EXPECT_EXIT(Parse({"prog", "stray"}), ::testing::ExitedWithCode(2), "unexpected argument \"stray\"");
  setenv("KVMESH_COMMAND_LINE_TEST_PORT", "not-a-number", 1);
  EXPECT_EXIT(Parse({"prog"}), ::testing::ExitedWithCode(2), "KVMESH_COMMAND_LINE_TEST_PORT");
  unsetenv("KVMESH_COMMAND_LINE_TEST_PORT");
}

TEST(CommandLineDeathTest, OutOfRangeValuesExitWithTwoNamingTheFlag) {
  // 80000 used to wrap to port 14464 when narrowed to 16 bits.
  EXPECT_EXIT(Parse({"prog", "--command-line-test-port=80000"}), ::testing::ExitedWithCode(2),
              "test: --command_line_test_port=80000 is out of range \\[0, 65535\\]");
  EXPECT_EXIT(Parse({"prog", "--command_line_test_port=-1"}), ::testing::ExitedWithCode(2),
              "--command_line_test_port=-1 is out of range");
  setenv("KVMESH_COMMAND_LINE_TEST_PORT", "65536", 1);
  EXPECT_EXIT(Parse({"prog"}), ::testing::ExitedWithCode(2), "--command_line_test_port=65536 is out of range");
  unsetenv("KVMESH_COMMAND_LINE_TEST_PORT");
}

TEST(CommandLineDeathTest, AnAddressWithAPortBeyond65535ExitsWithTwoNamingTheFlag) {
  EXPECT_EXIT(Parse({"prog", "--command-line-test-listen=127.0.0.1:99999"}), ::testing::ExitedWithCode(2),
              "--command_line_test_listen: address \"127.0.0.1:99999\": port 99999 is out of range");
  EXPECT_EXIT(Parse({"prog", "--command-line-test-listen=no-port"}), ::testing::ExitedWithCode(2),
              "--command_line_test_listen: address \"no-port\": expected host:port");
}

// NOTE: through CheckFlags, not Parse: Abseil allows one in-process parse per binary
// (SetProgramUsageMessage), which DashesEnvironmentDefaults... takes.
TEST(CommandLineTest, InRangeValuesAndGoodAddressesPass) {
  const auto ours = [](const absl::CommandLineFlag& flag) {
    return std::string(flag.Filename()).find("command_line_test") != std::string::npos;
  };
  const int port = absl::GetFlag(FLAGS_command_line_test_port);
  const std::string listen = absl::GetFlag(FLAGS_command_line_test_listen);
  absl::SetFlag(&FLAGS_command_line_test_port, 65535);
  absl::SetFlag(&FLAGS_command_line_test_listen, "[::1]:50052");
  EXPECT_TRUE(CheckFlags(ours).ok());
  absl::SetFlag(&FLAGS_command_line_test_listen, "dns:///scheduler:50052");
  EXPECT_TRUE(CheckFlags(ours).ok());
  absl::SetFlag(&FLAGS_command_line_test_listen, "unix:/tmp/socket");
  EXPECT_TRUE(CheckFlags(ours).ok());
  absl::SetFlag(&FLAGS_command_line_test_listen, "dns:///scheduler:70000");
  EXPECT_EQ(CheckFlags(ours).code(), absl::StatusCode::kInvalidArgument);
  absl::SetFlag(&FLAGS_command_line_test_port, port);
  absl::SetFlag(&FLAGS_command_line_test_listen, listen);
}

}  // namespace
}  // namespace kvmesh
