#include "cli/cli_common.h"

#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/command_line.h"
#include "core/logging.h"
#include "core/status_macros.h"
#include "core/flag_checks.h"

ABSL_FLAG(std::string, model, KVMESH_DEFAULT_MODEL_DIR,
          "Hugging Face model directory (config.json, *.safetensors, tokenizer.json), or a llama-family "
          ".gguf file (dequantized to bf16 at load). "
          "Default: the embedded tiny model.");
ABSL_FLAG(std::string, chat_template, "",
          "A Jinja chat template file (or llama3, chatml, mistral) used instead of the model's own.");
ABSL_FLAG(std::string, backend, "cpu", "Backend for the model ops: cpu or reference (the slow scalar oracle).");
ABSL_FLAG(std::string, device, "cpu",
          "Where the model runs: cpu, or cuda (GPU 0; cuda:N for GPU N): weights, KV cache and every op on the GPU.");
ABSL_FLAG(int, threads, 0,
          "Kernel threads; 0: one per CPU this process may use (its affinity mask, capped by its cgroup CPU quota, "
          "e.g. Kubernetes limits.cpu).");
ABSL_FLAG(std::string, compute_dtype, "f32",
          "What the CPU backend's matrix products compute in: f32 (exact f32 activations; the default) or bf16 "
          "(activations rounded to bf16 into bf16 dot products with f32 sums, weights packed as bf16: the "
          "numerics vLLM and llama.cpp use for bf16 models, about 3x faster on AMX).");
KVMESH_FLAG_RANGE(threads, 0, 4096);
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error.");
ABSL_DECLARE_FLAG(int, tensor_parallel_size);  // engine_flags.cc

namespace kvmesh::cli {
namespace {

std::vector<std::string>& HelpFiles() {
  static std::vector<std::string> files;
  return files;
}

bool IsSubcommandFile(absl::string_view file) {
  if (absl::StrContains(file, "cli_common")) return true;
  for (const std::string& f : HelpFiles()) {
    if (absl::StrContains(file, f)) return true;
  }
  return false;
}

// KVMESH_<NAME> sets the default of flag <name> defined by the CLI.
void ApplyEnvironmentDefaults() {
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!IsSubcommandFile(flag->Filename()) && !absl::StrContains(flag->Filename(), "services/kvmesh")) continue;
    const std::string env = absl::StrCat("KVMESH_", absl::AsciiStrToUpper(name));
    const char* value = std::getenv(env.c_str());
    if (value == nullptr) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      std::fprintf(stderr, "kvmesh: bad value in %s: %s\n", env.c_str(), error.c_str());
      std::exit(2);
    }
  }
}

}  // namespace

std::string ModelDirFlag() { return absl::GetFlag(FLAGS_model); }

std::string ChatTemplateFlag() { return absl::GetFlag(FLAGS_chat_template); }

std::string BaseName(std::string path) {
  while (!path.empty() && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::vector<std::string> ParseSubcommandFlags(int argc, char** argv, const std::string& usage,
                                              const std::vector<std::string>& help_files) {
  HelpFiles() = help_files;
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) { return IsSubcommandFile(file); };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.normalize_filename = [](absl::string_view file) { return std::string(file); };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  ApplyEnvironmentDefaults();
  std::vector<std::string> normalized;
  normalized.reserve(argc);
  for (int i = 0; i < argc; ++i) normalized.push_back(i == 0 ? std::string(argv[0]) : NormalizeFlagName(argv[i]));
  std::vector<char*> args;
  for (std::string& s : normalized) args.push_back(s.data());
  std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  ExitOnBadFlagValues("kvmesh", [](const absl::CommandLineFlag& flag) {
    return IsSubcommandFile(flag.Filename()) || absl::StrContains(flag.Filename(), "services/kvmesh");
  });
  LogLevel level;
  if (!ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    std::fprintf(stderr, "kvmesh: --log_level must be debug, info, warning or error\n");
    std::exit(2);
  }
  SetLogLevel(level);
  return std::vector<std::string>(positional.begin() + 1, positional.end());
}

absl::StatusOr<int> CudaDeviceFromFlags() {
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "cpu") return -1;
  if (device == "cuda") return 0;
  int index = 0;
  if (absl::StartsWith(device, "cuda:") && absl::SimpleAtoi(device.substr(5), &index) && index >= 0) return index;
  return absl::InvalidArgumentError(absl::StrCat("--device must be cpu, cuda or cuda:N, not \"", device, "\""));
}

absl::StatusOr<DType> ComputeDTypeFromFlags() {
  const std::string name = absl::GetFlag(FLAGS_compute_dtype);
  if (name != "f32" && name != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("--compute-dtype must be f32 or bf16, not \"", name, "\""));
  }
  if (name == "f32") return DType::kF32;
  KVMESH_ASSIGN_OR_RETURN(const int cuda_device, CudaDeviceFromFlags());
  if (cuda_device >= 0 || absl::GetFlag(FLAGS_backend) != "cpu") {
    return absl::InvalidArgumentError("--compute-dtype bf16 applies to --device cpu with --backend cpu only");
  }
  return DType::kBF16;
}

absl::StatusOr<LoadedModel> LoadModelFromFlags(bool quiet) {
  const auto start = std::chrono::steady_clock::now();
  LoadedModel loaded;
  const std::string backend_name = absl::GetFlag(FLAGS_backend);
  KVMESH_ASSIGN_OR_RETURN(const int cuda_device, CudaDeviceFromFlags());
  KVMESH_RETURN_IF_ERROR(ComputeDTypeFromFlags().status());  // refused before any load
  if (cuda_device >= 0) {
    if (backend_name != "cpu") return absl::InvalidArgumentError("--backend applies to --device cpu only");
    KVMESH_ASSIGN_OR_RETURN(loaded.backend, backend::CreateCudaBackend(cuda_device));
  } else if (backend_name == "cpu") {
    KVMESH_ASSIGN_OR_RETURN(const DType compute_dtype, ComputeDTypeFromFlags());
    KVMESH_ASSIGN_OR_RETURN(loaded.backend, backend::CreateCpuBackend({.num_threads = absl::GetFlag(FLAGS_threads),
                                                                      .compute_dtype = compute_dtype}));
  } else if (backend_name == "reference") {
    loaded.backend = backend::CreateReferenceBackend();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend must be cpu or reference, not \"", backend_name, "\""));
  }
  const std::string dir = absl::GetFlag(FLAGS_model);
  const bool tty = isatty(STDERR_FILENO);
  engine::LlamaModelOptions options;
  // Under tensor parallelism the engine's rank threads load their own shards: this copy
  // (config, tokenizer) then holds only rank 0's slice instead of a whole extra model.
  options.tensor_parallel_size = std::max(1, absl::GetFlag(FLAGS_tensor_parallel_size));
  if (!quiet) {
    options.on_progress = [tty, &dir](const engine::LoadProgress& p) {
      if (!tty && p.done != p.total) return;
      std::fprintf(stderr, "%sloading %s: %s %lld/%lld", tty ? "\r\033[K" : "", dir.c_str(), p.stage.c_str(),
                   static_cast<long long>(p.done), static_cast<long long>(p.total));
      if (!tty) std::fputc('\n', stderr);
      std::fflush(stderr);
    };
  }
  KVMESH_ASSIGN_OR_RETURN(loaded.model, engine::LlamaModel::Load(dir, *loaded.backend, options));
  KVMESH_ASSIGN_OR_RETURN(loaded.tokenizer, model::Tokenizer::FromDirectory(dir));
  loaded.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!quiet) {
    const auto& c = loaded.model->config();
    std::fprintf(stderr, "%sloaded %s (%s, %lld layers, hidden %lld, vocab %lld) on %s in %.2f s\n",
                 tty ? "\r\033[K" : "", dir.c_str(), c.model_type.c_str(), static_cast<long long>(c.num_hidden_layers),
                 static_cast<long long>(c.hidden_size), static_cast<long long>(c.vocab_size),
                 std::string(loaded.backend->name()).c_str(), loaded.load_seconds);
  }
  return loaded;
}

absl::StatusOr<LoadedModel> LoadModelOffThread(bool quiet) {
  // NOTE: libgomp keeps one worker pool per thread that ever opened a parallel region.
  // A second pool (the loading thread's, next to the engine thread's) makes libgomp
  // count more threads than cores and switch to throttled spinning: every parallel
  // region of the engine then pays futex sleeps and wake-ups, measured 2.3x slower
  // decode. A pool dies with its thread, so pack on a thread that then exits.
  absl::StatusOr<LoadedModel> loaded = absl::UnknownError("model not loaded");
  std::thread([&loaded, quiet] { loaded = LoadModelFromFlags(quiet); }).join();
  return loaded;
}

}  // namespace kvmesh::cli
