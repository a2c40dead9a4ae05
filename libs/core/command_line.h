// ParseServiceCommandLine: Abseil flags parsed the way every kvmesh service binary
// (kvmesh-scheduler, kvmesh-router) takes them:
//   - `--worker-ttl-ms=5` is accepted for `--worker_ttl_ms=5` (Abseil names have no dashes);
//   - KVMESH_<FLAG> environment variables set the defaults of the service's own flags
//     (KVMESH_LISTEN=0.0.0.0:50052); a bad value exits with status 2;
//   - `--help` / `-h` / `--helpfull` prints the usage and the service's own flags with
//     their defaults and variables, and exits 0;
//   - a positional argument exits with status 2;
//   - a flag value out of its KVMESH_FLAG_RANGE / not a KVMESH_FLAG_ADDRESS
//     (core/flag_checks.h) exits with status 2 and a message naming the flag.
// "The service's own flags" are those defined in a source file whose path contains
// `flags_path` (e.g. "services/scheduler"), not those of linked libraries.
//
// Thread-safety: call once, first thing in main(), before other threads start.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"

namespace kvmesh {

struct CommandLineOptions {
  std::string program;     // for messages: "kvmesh-scheduler"
  std::string usage;       // printed by --help above the flags
  std::string flags_path;  // see above
  // Also the service's own: flags defined in files whose path contains one of these
  // (shared flag files of libraries, e.g. rpc's "tls_flags").
  std::vector<std::string> extra_flag_files;
};

void ParseServiceCommandLine(int argc, char** argv, const CommandLineOptions& options);

// CheckFlags (core/flag_checks.h) over the flags `is_ours` selects; on an error prints
// "<program>: <message>" and exits with status 2. For parsers other than the one above.
void ExitOnBadFlagValues(const std::string& program,
                         const std::function<bool(const absl::CommandLineFlag&)>& is_ours);

// `--max-tokens=3` -> `--max_tokens=3`: dashes in a flag's name (not its value) become
// underscores. Anything else is returned unchanged.
std::string NormalizeFlagName(const char* arg);

}  // namespace kvmesh
