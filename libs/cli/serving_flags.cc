// Flags of the long-running serving commands — `kvmesh serve`, `kvmesh router`, `kvmesh
// worker` and the worker binaries (libs/worker) — defined once here so that each
// of them can declare them (ABSL_DECLARE_FLAG). --help lists this file as
// "serving_flags".
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "core/flag_checks.h"

ABSL_FLAG(std::string, served_model_name, "", "Model name clients use (default: the model directory's name).");
ABSL_FLAG(int64_t, drain_timeout_ms, 30000, "On SIGTERM: how long running requests may take to finish.");
KVMESH_FLAG_RANGE(drain_timeout_ms, 0, 86400000);
