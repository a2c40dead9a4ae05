// --kv-cache-dtype, in a file of its own so that `kvmesh generate --help` can list it
// without the paged-engine flags (its name still matches kEngineFlagsFile for the
// commands that list those).
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/cli_common.h"
#include "core/status_macros.h"
#include "cli/engine_flags.h"

ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "KV cache element type: auto (bf16 for a bf16 model, else f32), f32, bf16, or fp8 (e4m3, scales 1.0; "
          "--device cuda only).");

namespace kvmesh::cli {

absl::StatusOr<DType> KvCacheDTypeFromFlags(const engine::LlamaModel& model) {
  const std::string name = absl::GetFlag(FLAGS_kv_cache_dtype);
  if (name == "f32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  if (name == "fp8" || name == "fp8_e4m3") {
    KVMESH_ASSIGN_OR_RETURN(const int cuda_device, CudaDeviceFromFlags());
    if (cuda_device < 0)
      return absl::InvalidArgumentError("--kv-cache-dtype fp8 needs --device cuda (the CPU backends keep f32 or bf16 KV)");
    return DType::kFP8E4M3;
  }
  if (name == "auto") return model.weights().embed_tokens.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  return absl::InvalidArgumentError(
      absl::StrCat("--kv-cache-dtype must be auto, f32, bf16 or fp8, not \"", name, "\""));
}

}  // namespace kvmesh::cli
