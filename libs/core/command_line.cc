#include "core/command_line.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/flag_checks.h"

namespace kvmesh {
namespace {

bool IsOurFlag(const absl::CommandLineFlag& flag, const CommandLineOptions& options) {
  if (absl::StrContains(flag.Filename(), options.flags_path)) return true;
  for (const std::string& file : options.extra_flag_files) {
    if (absl::StrContains(flag.Filename(), file)) return true;
  }
  return false;
}

void PrintHelp(const CommandLineOptions& options) {
  std::cout << options.usage << "\nFlags:\n";
  std::map<std::string, const absl::CommandLineFlag*> sorted;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsOurFlag(*flag, options)) sorted.emplace(std::string(name), flag);
  }
  for (const auto& [name, flag] : sorted) {
    std::cout << "  --" << name << " (" << flag->Help() << ")\n      default: " << flag->DefaultValue()
              << "   env: KVMESH_" << absl::AsciiStrToUpper(name) << "\n";
  }
}

void ApplyEnvironmentDefaults(const CommandLineOptions& options) {
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!IsOurFlag(*flag, options)) continue;
    const std::string env = absl::StrCat("KVMESH_", absl::AsciiStrToUpper(name));
    const char* value = std::getenv(env.c_str());
    if (value == nullptr) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      std::fprintf(stderr, "%s: bad value in %s: %s\n", options.program.c_str(), env.c_str(), error.c_str());
      std::exit(2);
    }
  }
}

}  // namespace

std::string NormalizeFlagName(const char* arg) {
  std::string s(arg);
  if (s.size() < 3 || s[0] != '-' || s[1] != '-') return s;
  const size_t end = std::min(s.find('='), s.size());
  for (size_t i = 2; i < end; ++i) {
    if (s[i] == '-') s[i] = '_';
  }
  return s;
}

void ParseServiceCommandLine(int argc, char** argv, const CommandLineOptions& options) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0 ||
        std::strcmp(argv[i], "--helpfull") == 0) {
      PrintHelp(options);
      std::exit(0);
    }
  }
  absl::SetProgramUsageMessage(options.usage);
  ApplyEnvironmentDefaults(options);
  std::vector<std::string> normalized;
  for (int i = 0; i < argc; ++i) normalized.push_back(i == 0 ? std::string(argv[0]) : NormalizeFlagName(argv[i]));
  std::vector<char*> args;
  for (std::string& s : normalized) args.push_back(s.data());
  const std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (positional.size() > 1) {
    std::fprintf(stderr, "%s: unexpected argument \"%s\" (see --help)\n", options.program.c_str(), positional[1]);
    std::exit(2);
  }
  ExitOnBadFlagValues(options.program, [&options](const absl::CommandLineFlag& flag) { return IsOurFlag(flag, options); });
}

void ExitOnBadFlagValues(const std::string& program,
                         const std::function<bool(const absl::CommandLineFlag&)>& is_ours) {
  if (absl::Status s = CheckFlags(is_ours); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", program.c_str(), std::string(s.message()).c_str());
    std::exit(2);
  }
}

}  // namespace kvmesh
