// `kvmesh generate`: one prompt in, text streamed to stdout as it is decoded.
// With --json, one JSON object per generated token: {"id", "text", "logprob"}
// (plus "top_logprobs" with --logprobs N, and "finish_reason" on the last).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cli/cli_common.h"
#include "commands.h"
#include "cli/engine_flags.h"
#include "engine/single_sequence_generator.h"
#include "model/chat_template.h"
#include "core/flag_checks.h"

ABSL_FLAG(std::string, prompt, "", "The prompt text (required).");
ABSL_FLAG(bool, chat, false, "Wrap --prompt as a user message in the model's chat template.");
ABSL_FLAG(std::string, system, "", "With --chat: a system message before the prompt.");
ABSL_FLAG(int, max_tokens, 64, "Maximum tokens to generate.");
KVMESH_FLAG_RANGE(max_tokens, 1, 1 << 24);
ABSL_FLAG(int, min_tokens, 0, "Suppress EOS/stop tokens until this many tokens are generated.");
KVMESH_FLAG_RANGE(min_tokens, 0, 1 << 24);
ABSL_FLAG(double, temperature, 1.0, "Sampling temperature; 0 means greedy.");
KVMESH_FLAG_RANGE(temperature, 0, 100);
ABSL_FLAG(int, top_k, -1, "Keep the k most likely tokens; -1 disables.");
KVMESH_FLAG_RANGE(top_k, -1, 1 << 30);
ABSL_FLAG(double, top_p, 1.0, "Nucleus sampling mass in (0, 1]; 1 disables.");
KVMESH_FLAG_RANGE(top_p, 0, 1);
ABSL_FLAG(double, min_p, 0.0, "Drop tokens below min_p x the top probability; 0 disables.");
KVMESH_FLAG_RANGE(min_p, 0, 1);
ABSL_FLAG(int64_t, seed, -1, "Sampling seed for reproducible output; -1 draws one.");
KVMESH_FLAG_RANGE(seed, -1, INT64_MAX);
ABSL_FLAG(double, repetition_penalty, 1.0, "Penalty > 1 discourages tokens seen in prompt or output.");
KVMESH_FLAG_RANGE(repetition_penalty, 0, 100);
ABSL_FLAG(double, presence_penalty, 0.0, "In [-2, 2]: subtracted once from tokens already generated.");
KVMESH_FLAG_RANGE(presence_penalty, -2, 2);
ABSL_FLAG(double, frequency_penalty, 0.0, "In [-2, 2]: subtracted per occurrence in the output.");
KVMESH_FLAG_RANGE(frequency_penalty, -2, 2);
ABSL_FLAG(int, logprobs, -1, "With --json: also print the top N logprobs per token.");
KVMESH_FLAG_RANGE(logprobs, -1, 1024);
ABSL_FLAG(std::string, stop_token_ids, "", "Comma-separated token ids that end generation.");
ABSL_FLAG(bool, ignore_eos, false, "Keep generating past the end-of-sequence token.");
ABSL_FLAG(bool, json, false, "Print one JSON object per token instead of plain text.");
ABSL_DECLARE_FLAG(int, tensor_parallel_size);  // engine_flags.cc

namespace kvmesh::cli {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvmesh generate: %s\n", message.c_str());
  return 1;
}

absl::StatusOr<engine::SamplingParams> SamplingParamsFromFlags() {
  engine::SamplingParams p;
  p.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  p.top_k = absl::GetFlag(FLAGS_top_k);
  p.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  p.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  if (absl::GetFlag(FLAGS_seed) >= 0) p.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  p.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  p.presence_penalty = static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  p.frequency_penalty = static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  p.logprobs = absl::GetFlag(FLAGS_logprobs);
  p.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  p.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  p.min_tokens = absl::GetFlag(FLAGS_min_tokens);
  for (absl::string_view piece : absl::StrSplit(absl::GetFlag(FLAGS_stop_token_ids), ',', absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id))
      return absl::InvalidArgumentError(absl::StrCat("--stop_token_ids: \"", piece, "\" is not a token id"));
    p.stop_token_ids.push_back(id);
  }
  return p;
}

absl::StatusOr<std::string> PromptText(const std::string& model_dir, const model::Tokenizer& tokenizer) {
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  if (!absl::GetFlag(FLAGS_chat)) return prompt;
  absl::StatusOr<model::ChatTemplate> tmpl = model::ChatTemplate::ForModel(model_dir, ChatTemplateFlag());
  if (!tmpl.ok()) return tmpl.status();
  std::vector<model::ChatMessage> messages;
  if (!absl::GetFlag(FLAGS_system).empty()) messages.push_back({"system", absl::GetFlag(FLAGS_system)});
  messages.push_back({"user", prompt});
  const auto bos = tokenizer.bos_token_id();
  return tmpl->Apply(messages, /*add_generation_prompt=*/true, bos ? tokenizer.IdToToken(*bos) : "");
}

}  // namespace

int RunGenerate(int argc, char** argv) {
  ParseSubcommandFlags(argc, argv,
                       "kvmesh generate --prompt TEXT [--max-tokens N --temperature T --top-p P --seed S --json]",
                       {"generate_command", "engine_flags_kv_cache_dtype"});
  if (absl::GetFlag(FLAGS_prompt).empty()) return Fail("--prompt is required");
  auto params = SamplingParamsFromFlags();
  if (!params.ok()) return Fail(std::string(params.status().message()));
  const bool json = absl::GetFlag(FLAGS_json);
  if (json && params->logprobs < 0) params->logprobs = 0;  // every JSON line carries its token's logprob
  auto loaded = LoadModelFromFlags(/*quiet=*/json);
  if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
  const model::Tokenizer& tokenizer = *loaded->tokenizer;
  auto text = PromptText(ModelDirFlag(), tokenizer);
  if (!text.ok()) return Fail(std::string(text.status().message()));
  // A chat template writes its own BOS text, which Encode() matches as the special token.
  const std::vector<int32_t> prompt = tokenizer.Encode(*text, /*add_special_tokens=*/!absl::GetFlag(FLAGS_chat));

  std::vector<int32_t> eos = loaded->model->config().eos_token_ids;
  if (auto id = tokenizer.eos_token_id(); id && std::find(eos.begin(), eos.end(), *id) == eos.end()) eos.push_back(*id);

  model::IncrementalDetokenizer detokenizer(tokenizer, /*skip_special_tokens=*/true);
  auto on_token = [&](const engine::GeneratedToken& token) {
    std::string piece = detokenizer.Append(token.sample.token_id);
    if (token.stop.finished()) piece += detokenizer.Flush();
    if (!json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    }
    nlohmann::json obj;
    obj["id"] = token.sample.token_id;
    obj["text"] = piece;
    if (token.sample.logprob) obj["logprob"] = *token.sample.logprob;
    if (!token.sample.top_logprobs.empty()) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& t : token.sample.top_logprobs) {
        nlohmann::json entry;
        entry["id"] = t.token_id;
        entry["logprob"] = t.logprob;
        top.push_back(std::move(entry));
      }
      obj["top_logprobs"] = std::move(top);
    }
    if (token.stop.finished()) obj["finish_reason"] = std::string(engine::FinishReasonName(token.stop.reason));
    const std::string line = obj.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  // The KV precision `serve` would use (--kv-cache-dtype), so both give the same tokens.
  auto kv_dtype = KvCacheDTypeFromFlags(*loaded->model);
  if (!kv_dtype.ok()) return Fail(std::string(kv_dtype.status().message()));
  auto cuda_device = CudaDeviceFromFlags();
  if (!cuda_device.ok()) return Fail(std::string(cuda_device.status().message()));
  absl::StatusOr<engine::GenerationResult> result;
  if (*cuda_device >= 0 || absl::GetFlag(FLAGS_tensor_parallel_size) > 1) {
    // On a GPU the paged CUDA runner computes, and under --tensor-parallel-size the
    // tensor-parallel runner: the dense path is one whole model in host memory only.
    auto built = BuildEngineFromFlags(*loaded->model);
    if (!built.ok()) return Fail(std::string(built.status().message()));
    result = engine::GenerateSingleSequenceOnRunner(*built->runner, built->options.max_model_len,
                                                    built->options.scheduler.max_num_batched_tokens, prompt, *params,
                                                    eos, on_token);
  } else {
    result = engine::GenerateSingleSequence(*loaded->model, prompt, *params, eos, on_token, *kv_dtype);
  }
  if (!result.ok()) return Fail(std::string(result.status().message()));
  if (!json) {
    std::fputc('\n', stdout);
    const double decode_tps = result->num_output_tokens > 1
                                  ? (result->num_output_tokens - 1) / std::max(1e-9, result->decode_seconds)
                                  : 0.0;
    std::fprintf(stderr, "[%d prompt tokens in %.3f s; %d generated, %.1f tokens/s; finish_reason=%s]\n",
                 result->num_prompt_tokens, result->prefill_seconds, result->num_output_tokens, decode_tps,
                 std::string(engine::FinishReasonName(result->finish_reason)).c_str());
  }
  return 0;
}

}  // namespace kvmesh::cli
