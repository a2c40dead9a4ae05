// What every kvmesh subcommand shares: the model/backend flags, environment
// variable equivalents, and loading a model with a progress display.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "backend/ops.h"
#include "engine/llama_model.h"
#include "model/tokenizer.h"

namespace kvmesh::cli {

// A loaded model and what it runs on. The backend outlives the model.
struct LoadedModel {
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<engine::LlamaModel> model;
  std::unique_ptr<model::Tokenizer> tokenizer;
  double load_seconds = 0;
};

// --device: -1 for cpu, else the CUDA device index (cuda = 0, cuda:N = N).
// InvalidArgument for anything else.
absl::StatusOr<int> CudaDeviceFromFlags();
// --compute-dtype: f32 or bf16 (backend::CpuBackendOptions::compute_dtype); bf16 only
// with --device cpu --backend cpu. InvalidArgument otherwise.
absl::StatusOr<DType> ComputeDTypeFromFlags();

// --model (default: the embedded tiny model), --backend, --threads.
std::string ModelDirFlag();
// --chat-template: "" (the model's own), a Jinja file, or a built-in name.
std::string ChatTemplateFlag();
// Loads config, weights and tokenizer from --model onto --backend, printing
// progress and the time taken to stderr unless `quiet`.
absl::StatusOr<LoadedModel> LoadModelFromFlags(bool quiet);

// LoadModelFromFlags on a short-lived thread, for processes whose engine runs on a
// thread of its own (serve, worker): the OpenMP pool that packing creates dies with
// that thread, so the engine thread's pool is the process's only one (see the .cc).
absl::StatusOr<LoadedModel> LoadModelOffThread(bool quiet);

// The last component of a directory path ("/models/llama/" -> "llama").
std::string BaseName(std::string path);

// Parses `argv` (after the subcommand) with Abseil flags: `--max-tokens` is
// accepted for `--max_tokens`; KVMESH_<FLAG> environment variables set defaults
// (e.g. KVMESH_MODEL=/models/x); `--help` lists the flags of `help_files` (file
// name fragments of the subcommand's sources) and of cli_common.cc. Returns the
// positional arguments.
std::vector<std::string> ParseSubcommandFlags(int argc, char** argv, const std::string& usage,
                                              const std::vector<std::string>& help_files);

}  // namespace kvmesh::cli
