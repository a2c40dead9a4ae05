// TextGenerationStream: turns one request's stream of engine outputs (token ids)
// into what a client sees — per-sample text deltas, stop strings, finish reasons
// and usage. Shared by the REST and gRPC front doors, whether tokens come from a
// local engine (kvmesh serve) or from remote decode workers (router).
//
// Text is detokenized incrementally (never half a UTF-8 character) and held back
// while it could still be the start of a stop string. When a stop string appears,
// the text before it is emitted, the sample finishes with "stop", and later tokens
// of that sample are ignored; the caller aborts the engine request once
// all_finished() (the engine does not know about stop strings).
//
// Thread-safety: not thread-safe; one per request, fed by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "model/tokenizer.h"

namespace kvmesh::serving {

struct TextGenerationOptions {
  int32_t n = 1;
  std::vector<std::string> stop;  // stop strings (OpenAI `stop`)
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;  // vLLM's option
};

// What one sample produced since the previous Consume().
struct SampleDelta {
  int32_t index = 0;
  std::string text;                 // may be empty (held back) even when tokens arrived
  std::vector<int32_t> token_ids;   // new tokens
  std::vector<engine::SampleResult> logprobs;  // one per new token when requested
  // Set on the sample's last delta: "stop", "length", "abort" or "error".
  std::optional<std::string> finish_reason;
  // The stop string that ended the sample (finish_reason "stop" by a stop string).
  std::optional<std::string> stop_string;
};

class TextGenerationStream {
 public:
  // The tokenizer must outlive the stream.
  TextGenerationStream(const model::Tokenizer& tokenizer, const TextGenerationOptions& options);
  ~TextGenerationStream();
  TextGenerationStream(const TextGenerationStream&) = delete;
  TextGenerationStream& operator=(const TextGenerationStream&) = delete;

  // Consumes one engine output; returns the deltas of the samples that changed
  // (text, tokens or finish), by index.
  std::vector<SampleDelta> Consume(const engine::RequestOutput& output);

  // Every sample has a finish reason (from the engine or a stop string).
  bool all_finished() const;
  // A stop string finished some sample while the engine still runs it.
  bool needs_abort() const;

  int32_t num_prompt_tokens() const { return num_prompt_tokens_; }
  int32_t num_cached_prompt_tokens() const { return num_cached_prompt_tokens_; }
  // Tokens generated across all samples, up to each sample's finish.
  int32_t num_completion_tokens() const;
  // The full text of sample `index` so far.
  const std::string& text(int32_t index) const;

 private:
  struct Sample;
  const model::Tokenizer& tokenizer_;
  TextGenerationOptions options_;
  std::vector<std::unique_ptr<Sample>> samples_;
  int32_t num_prompt_tokens_ = 0;
  int32_t num_cached_prompt_tokens_ = 0;
};

}  // namespace kvmesh::serving
