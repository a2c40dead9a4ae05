// The OpenAI REST protocol as plain structs: request parsing + validation for
// /v1/completions and /v1/chat/completions, and the response / streaming-chunk /
// model-list JSON builders. No engine types and no JSON library in this header
// (nlohmann stays in openai_protocol.cc).
//
// Parsing follows OpenAI/vLLM: unknown fields are ignored, `null` means "absent",
// integer fields accept integral numbers (2.0) but not 2.5 or "2", and every wrong
// type or out-of-range value is an ApiError (400 invalid_request_error) naming the
// field in `param` (nested: "messages[1].content[0].type", "stop[2]").
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "http/api_error.h"

namespace kvmesh::http {

inline constexpr int32_t kMaxStopStrings = 16;     // OpenAI allows 4; vLLM has no limit
inline constexpr int32_t kMaxN = 128;              // OpenAI's bound on `n`
inline constexpr int32_t kMaxLogprobs = 20;        // completions `logprobs`, chat `top_logprobs`

// Either a text prompt or pre-tokenized token ids.
struct Prompt {
  std::string text;
  std::vector<int32_t> token_ids;
  bool is_token_ids = false;
};

// Fields shared by both endpoints (sampling and streaming). Optional ones left unset
// mean "the model's / server's default".
struct SamplingFields {
  std::optional<int32_t> max_tokens;      // >= 1 (chat: max_completion_tokens wins over max_tokens)
  std::optional<int32_t> min_tokens;      // >= 0 (vLLM extension)
  std::optional<double> temperature;      // [0, 2]
  std::optional<double> top_p;            // (0, 1]
  std::optional<int32_t> top_k;           // -1 or 0 = off, else >= 1
  std::optional<double> min_p;            // [0, 1]
  int32_t n = 1;                          // [1, kMaxN]
  bool stream = false;
  bool include_usage = false;             // stream_options.include_usage (stream only)
  std::vector<std::string> stop;          // non-empty strings, at most kMaxStopStrings
  std::vector<int32_t> stop_token_ids;    // vLLM extension, each >= 0
  std::optional<int64_t> seed;
  double presence_penalty = 0.0;          // [-2, 2]
  double frequency_penalty = 0.0;         // [-2, 2]
  double repetition_penalty = 1.0;        // (0, 2]   (vLLM extension)
  bool ignore_eos = false;                // vLLM extension
  bool skip_special_tokens = true;        // vLLM extension
  std::string user;
  // vLLM extension: only requests with the same salt share cached KV. Non-empty, at
  // most kMaxCacheSaltBytes (core/cache_salt.h); "" when absent or null.
  std::string cache_salt;
  // token id -> bias in [-100, 100] (-100 bans the token), in the request's order.
  std::vector<std::pair<int32_t, double>> logit_bias;
  std::optional<int32_t> prompt_logprobs;  // vLLM extension: [0, kMaxLogprobs]
};

struct CompletionRequest {
  std::string model;                      // "" when absent: the server's default model
  std::vector<Prompt> prompts;            // one per prompt in a batch (>= 1)
  SamplingFields sampling;
  std::optional<int32_t> logprobs;        // [0, kMaxLogprobs]: top-N alternatives per token
  // The prompt comes back before the completion (with its tokens' logprobs when logprobs
  // is set; the first token's is null). Only with echo may max_tokens be 0: the prompt
  // is scored and nothing is generated (lm-eval's loglikelihood requests).
  bool echo = false;
  // Samples generated per prompt, of which the n with the highest cumulative logprob are
  // returned; >= n; not with stream. Unset: n.
  std::optional<int32_t> best_of;
};

struct ChatMessage {
  std::string role;     // system | developer | user | assistant | tool
  std::string content;  // text parts concatenated; "" for a null assistant content
  std::string name;
  std::string tool_call_id;  // tool messages
  int32_t num_tool_calls = 0;  // assistant messages: entries of tool_calls
};

struct ChatCompletionRequest {
  std::string model;
  std::vector<ChatMessage> messages;      // >= 1
  SamplingFields sampling;
  bool logprobs = false;
  std::optional<int32_t> top_logprobs;    // [0, kMaxLogprobs], requires logprobs
  bool add_generation_prompt = true;      // vLLM extension
  // What the chat template is given, as JSON text in the request's key order: the
  // messages (each as sent, content parts joined into one string and a null content "",
  // developer as system,
  // tool_calls' string arguments parsed into objects as vLLM does) and `tools` ("" when
  // the request has none). tool_choice may be absent, "none" or "auto": kvmesh does not
  // constrain decoding to a call, so "required" and a named function are refused.
  std::string template_messages_json;
  std::string tools_json;
};

// Parse + validate a request body. Malformed JSON, invalid UTF-8 or a non-object body
// → 400 with an empty param.
std::variant<CompletionRequest, ApiError> ParseCompletionRequest(std::string_view body);
std::variant<ChatCompletionRequest, ApiError> ParseChatCompletionRequest(std::string_view body);

// ---- Responses -------------------------------------------------------------------

struct TopLogprob {
  std::string token;
  double logprob = 0.0;
};

// One generated token with its logprob and the top alternatives.
struct TokenLogprob {
  std::string token;
  double logprob = 0.0;
  std::vector<TopLogprob> top;
  bool null_logprob = false;  // an echoed first prompt token: logprob and top_logprobs render null
};

// vLLM's prompt_logprobs entry of one choice: [null, {"<id>": {"logprob", "rank",
// "decoded_token"}, ...}, ...], one object per prompt token after the first holding the
// token itself and its top alternatives.
struct PromptTokenLogprobs {
  struct Entry {
    int32_t token_id = 0;
    double logprob = 0.0;
    int32_t rank = 0;
    std::string decoded_token;
  };
  std::vector<Entry> entries;  // the prompt token first, then the top alternatives
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  std::optional<int32_t> cached_tokens;  // prompt_tokens_details.cached_tokens when set
};

struct Choice {
  int32_t index = 0;
  std::string text;                       // completion text / assistant message content / delta
  std::string finish_reason;              // "stop" | "length" | "abort" | ...; "" renders null
  // Rendered as a logprobs object when set (completions: tokens/token_logprobs/
  // top_logprobs/text_offset; chat: content[{token, logprob, bytes, top_logprobs}]).
  std::optional<std::vector<TokenLogprob>> logprobs;
  int32_t text_offset = 0;                // completions: offset of `text` in the full output
  // Completions with prompt_logprobs: rendered as "prompt_logprobs" (first element null).
  std::optional<std::vector<PromptTokenLogprobs>> prompt_logprobs;
};

struct ResponseMeta {
  std::string id;        // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;   // unix seconds
  std::string model;
};

// Non-streaming responses: object "text_completion" / "chat.completion".
std::string CompletionResponseJson(const ResponseMeta& meta, const std::vector<Choice>& choices,
                                   const Usage& usage);
std::string ChatCompletionResponseJson(const ResponseMeta& meta, const std::vector<Choice>& choices,
                                       const Usage& usage);

// Streaming chunks, each already framed as one SSE event ("data: {...}\n\n").
// `with_usage_null` adds "usage":null (OpenAI does so on every chunk when
// stream_options.include_usage is set).
std::string CompletionChunkEvent(const ResponseMeta& meta, const Choice& choice, bool with_usage_null);
// `role_delta` puts "role":"assistant" into the delta (the first chunk of a choice);
// an empty `choice.text` with no role renders an empty delta `{}` (the finish chunk).
std::string ChatCompletionChunkEvent(const ResponseMeta& meta, const Choice& choice, bool role_delta,
                                     bool with_usage_null);
// The final usage chunk ("choices":[]), object "text_completion" or "chat.completion.chunk".
std::string CompletionUsageChunkEvent(const ResponseMeta& meta, const Usage& usage);
std::string ChatCompletionUsageChunkEvent(const ResponseMeta& meta, const Usage& usage);
// An error in the middle of a stream: "data: {"error":...}\n\n".
std::string ErrorEvent(const ApiError& error);
// "data: [DONE]\n\n".
std::string_view DoneEvent();

struct ModelCard {
  std::string id;
  int64_t created = 0;
  std::string owned_by = "kvmesh";
  std::optional<int32_t> max_model_len;
};
// {"object":"list","data":[{"id","object":"model","created","owned_by"[,"max_model_len"]}]}
std::string ModelListJson(const std::vector<ModelCard>& models);

// vLLM's POST /tokenize: {"prompt": str, "add_special_tokens": true} or {"messages": [...],
// "add_generation_prompt": true, "add_special_tokens": false, "tools": [...]}, with
// optional "model" and "return_token_strs".
struct TokenizeRequest {
  std::string model;
  bool is_chat = false;
  std::string prompt;
  ChatCompletionRequest chat;  // is_chat: messages / tools / add_generation_prompt
  bool add_special_tokens = true;
  bool return_token_strs = false;
};
std::variant<TokenizeRequest, ApiError> ParseTokenizeRequest(std::string_view body);
// {"count", "max_model_len", "tokens", "token_strs"} (token_strs null unless asked).
std::string TokenizeResponseJson(const std::vector<int32_t>& tokens, int32_t max_model_len,
                                 const std::vector<std::string>* token_strs);
// vLLM's POST /detokenize: {"tokens": [ids], "model"?} -> {"prompt": str}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
std::variant<DetokenizeRequest, ApiError> ParseDetokenizeRequest(std::string_view body);
std::string DetokenizeResponseJson(const std::string& prompt);

}  // namespace kvmesh::http
