#include "core/flag_checks.h"

#include <string>

#include <gtest/gtest.h>

#include "absl/flags/flag.h"

// NOTE: this file's flags are outside command_line_test's "command_line_test" path filter,
// so the one without a range does not break the parses there.
ABSL_FLAG(double, flag_checks_test_fraction, 0.5, "A ranged floating-point flag.");
KVMESH_FLAG_RANGE(flag_checks_test_fraction, 0, 1);
ABSL_FLAG(int64_t, flag_checks_test_unranged, 3, "A numeric flag without a range (a programmer error).");

namespace kvmesh {
namespace {

auto Named(std::string name) {
  return [name](const absl::CommandLineFlag& flag) { return std::string(flag.Name()) == name; };
}

TEST(FlagChecksTest, AFloatingPointValueOutsideItsRangeIsInvalidArgumentNamingTheFlag) {
  EXPECT_TRUE(CheckFlags(Named("flag_checks_test_fraction")).ok());
  absl::SetFlag(&FLAGS_flag_checks_test_fraction, 1.5);
  const absl::Status s = CheckFlags(Named("flag_checks_test_fraction"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--flag_checks_test_fraction=1.5 is out of range [0, 1]");
  absl::SetFlag(&FLAGS_flag_checks_test_fraction, 0.5);
}

TEST(FlagChecksTest, ANumericFlagWithoutARangeIsInternal) {
  const absl::Status s = CheckFlags(Named("flag_checks_test_unranged"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("--flag_checks_test_unranged"), absl::string_view::npos);
}

}  // namespace
}  // namespace kvmesh
