// The flags of a worker process — kvmesh-prefill-worker, kvmesh-decode-worker and
// `kvmesh worker` — parsed into its options, and the model loaded and built from the
// model and engine flags (engine_flags.h), so that each binary's main parses its
// command line and starts a worker::Worker the same way.
#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "kvmesh/v1/scheduler.pb.h"
#include "worker/worker_options.h"

namespace kvmesh::cli {

struct WorkerCommandLine {
  const char* program = "kvmesh worker";  // in --help and error messages
  // A role binary's role; nullopt: --role decides.
  std::optional<v1::WorkerRole> role;
};

struct WorkerFromFlags {
  worker::WorkerOptions options;
  worker::WorkerModel model;
};

// Parses argv (after BlockStopSignals; --help exits), configures gRPC transport
// security, then loads and builds the model. InvalidArgument naming the flag for a bad
// one, or the loader's status.
absl::StatusOr<WorkerFromFlags> ParseWorkerCommandLine(int argc, char** argv, const WorkerCommandLine& command);

// Starts the worker, serves until SIGTERM / SIGINT, drains; the exit status (1 when it
// could not start, with the reason on stderr).
int ServeWorkerUntilStopped(const char* program, WorkerFromFlags worker);

// A worker binary's whole main (kvmesh-prefill-worker, kvmesh-decode-worker, `kvmesh
// worker`): BlockStopSignals, ParseWorkerCommandLine, ServeWorkerUntilStopped.
int RunWorkerCommand(int argc, char** argv, const WorkerCommandLine& command);

}  // namespace kvmesh::cli
