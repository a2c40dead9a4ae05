#include "http/openai_protocol.h"

#include <cmath>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/cache_salt.h"

namespace kvmesh::http {
namespace {

using Json = nlohmann::json;
using OJson = nlohmann::ordered_json;

// NOTE: parsing throws this internally (it never leaves this file) so that each
// field check is one line; Parse*Request catches it and returns the ApiError.
struct ParseFailure {
  ApiError error;
};

[[noreturn]] void Fail(std::string param, std::string message) {
  throw ParseFailure{ApiError::Invalid(std::move(param), std::move(message))};
}

std::string FormatNumber(double v) {
  OJson j = v;
  return j.dump();
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      return false;
    }
    i += len;
  }
  return true;
}

Json ParseObject(std::string_view body) {
  if (!IsValidUtf8(body)) Fail("", "request body is not valid UTF-8");
  Json root;
  try {
    root = Json::parse(body.begin(), body.end());
  } catch (const Json::exception& e) {
    Fail("", std::string("request body is not valid JSON: ") + e.what());
  }
  if (!root.is_object()) Fail("", "request body must be a JSON object");
  return root;
}

// The field `key` of `obj`, or nullptr when absent or null.
const Json* Field(const Json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<std::string> GetString(const Json& obj, const char* key) {
  const Json* v = Field(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) Fail(key, std::string("'") + key + "' must be a string");
  return v->get<std::string>();
}

std::optional<bool> GetBool(const Json& obj, const char* key, const std::string& param) {
  const Json* v = Field(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) Fail(param, "'" + param + "' must be a boolean");
  return v->get<bool>();
}

// An integer (an integral float such as 2.0 counts) in [lo, hi].
int64_t ToInt(const Json& v, const std::string& param, int64_t lo, int64_t hi) {
  int64_t value = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      Fail(param, "'" + param + "' is out of range");
    }
    value = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    value = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) Fail(param, "'" + param + "' must be an integer");
    if (d < -9.2e18 || d > 9.2e18) Fail(param, "'" + param + "' is out of range");
    value = static_cast<int64_t>(d);
  } else {
    Fail(param, "'" + param + "' must be an integer");
  }
  if (value < lo || value > hi) {
    Fail(param, "'" + param + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                    "], got " + std::to_string(value));
  }
  return value;
}

std::optional<int64_t> GetInt(const Json& obj, const char* key, int64_t lo, int64_t hi) {
  const Json* v = Field(obj, key);
  if (v == nullptr) return std::nullopt;
  return ToInt(*v, key, lo, hi);
}

// A finite number in [lo, hi] (or (lo, hi] when lo_open).
std::optional<double> GetDouble(const Json& obj, const char* key, double lo, double hi, bool lo_open = false) {
  const Json* v = Field(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) Fail(key, std::string("'") + key + "' must be a number");
  const double d = v->get<double>();
  if (!std::isfinite(d) || d > hi || (lo_open ? d <= lo : d < lo)) {
    Fail(key, std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") + FormatNumber(lo) + ", " +
                  FormatNumber(hi) + "], got " + FormatNumber(d));
  }
  return d;
}

void ParseStop(const Json& obj, SamplingFields* out) {
  const Json* v = Field(obj, "stop");
  if (v == nullptr) return;
  if (v->is_string()) {
    if (v->get_ref<const std::string&>().empty()) Fail("stop", "'stop' must not be an empty string");
    out->stop.push_back(v->get<std::string>());
    return;
  }
  if (!v->is_array()) Fail("stop", "'stop' must be a string or an array of strings");
  if (v->size() > static_cast<size_t>(kMaxStopStrings)) {
    Fail("stop", "'stop' accepts at most " + std::to_string(kMaxStopStrings) + " strings");
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& s = (*v)[i];
    const std::string param = "stop[" + std::to_string(i) + "]";
    if (!s.is_string()) Fail(param, "'" + param + "' must be a string");
    if (s.get_ref<const std::string&>().empty()) Fail(param, "'" + param + "' must not be empty");
    out->stop.push_back(s.get<std::string>());
  }
}

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32MaxForBias = kInt32Max;

// logit_bias: {"<token id>": bias, ...}; the keys are decimal strings (OpenAI's shape).
void ParseLogitBias(const Json& obj, SamplingFields* out) {
  const Json* lb = Field(obj, "logit_bias");
  if (lb == nullptr) return;
  if (!lb->is_object()) Fail("logit_bias", "'logit_bias' must be an object of token id -> bias");
  for (auto it = lb->begin(); it != lb->end(); ++it) {
    const std::string& key = it.key();
    const std::string param = "logit_bias." + key;
    int64_t id = -1;
    if (!key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos) {
      id = std::stoll(key);
    }
    if (id < 0 || id > kInt32MaxForBias) Fail(param, "'logit_bias' keys must be token ids (non-negative integers)");
    if (!it->is_number()) Fail(param, "'" + param + "' must be a number");
    const double bias = it->get<double>();
    if (!std::isfinite(bias) || bias < -100.0 || bias > 100.0) {
      Fail(param, "'" + param + "' must be in [-100, 100], got " + FormatNumber(bias));
    }
    out->logit_bias.emplace_back(static_cast<int32_t>(id), bias);
  }
}

void ParseSampling(const Json& obj, bool chat, SamplingFields* out) {
  // 0 only with echo (completions; checked there).
  if (auto v = GetInt(obj, "max_tokens", chat ? 1 : 0, kInt32Max)) out->max_tokens = static_cast<int32_t>(*v);
  if (chat) {
    if (auto v = GetInt(obj, "max_completion_tokens", 1, kInt32Max)) out->max_tokens = static_cast<int32_t>(*v);
  }
  if (auto v = GetInt(obj, "min_tokens", 0, kInt32Max)) out->min_tokens = static_cast<int32_t>(*v);
  out->temperature = GetDouble(obj, "temperature", 0.0, 2.0);
  out->top_p = GetDouble(obj, "top_p", 0.0, 1.0, /*lo_open=*/true);
  if (auto v = GetInt(obj, "top_k", -1, kInt32Max)) out->top_k = static_cast<int32_t>(*v);
  out->min_p = GetDouble(obj, "min_p", 0.0, 1.0);
  if (auto v = GetInt(obj, "n", 1, kMaxN)) out->n = static_cast<int32_t>(*v);
  if (auto v = GetBool(obj, "stream", "stream")) out->stream = *v;
  if (const Json* so = Field(obj, "stream_options")) {
    if (!so->is_object()) Fail("stream_options", "'stream_options' must be an object");
    if (!out->stream) Fail("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (auto v = GetBool(*so, "include_usage", "stream_options.include_usage")) out->include_usage = *v;
  }
  ParseStop(obj, out);
  if (const Json* ids = Field(obj, "stop_token_ids")) {
    if (!ids->is_array()) Fail("stop_token_ids", "'stop_token_ids' must be an array of integers");
    for (size_t i = 0; i < ids->size(); ++i) {
      out->stop_token_ids.push_back(
          static_cast<int32_t>(ToInt((*ids)[i], "stop_token_ids[" + std::to_string(i) + "]", 0, kInt32Max)));
    }
  }
  out->seed = GetInt(obj, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  if (auto v = GetDouble(obj, "presence_penalty", -2.0, 2.0)) out->presence_penalty = *v;
  if (auto v = GetDouble(obj, "frequency_penalty", -2.0, 2.0)) out->frequency_penalty = *v;
  if (auto v = GetDouble(obj, "repetition_penalty", 0.0, 2.0, /*lo_open=*/true)) out->repetition_penalty = *v;
  if (auto v = GetBool(obj, "ignore_eos", "ignore_eos")) out->ignore_eos = *v;
  if (auto v = GetBool(obj, "skip_special_tokens", "skip_special_tokens")) out->skip_special_tokens = *v;
  if (auto v = GetString(obj, "user")) out->user = std::move(*v);
  if (const Json* v = Field(obj, "cache_salt")) {
    // A wrong type gets the same message as an empty string: vLLM's one rule.
    const absl::Status valid =
        v->is_string() ? ValidateCacheSalt(v->get_ref<const std::string&>()) : ValidateCacheSalt("");
    if (!valid.ok()) Fail("cache_salt", std::string(valid.message()));
    out->cache_salt = v->get<std::string>();
  }

  ParseLogitBias(obj, out);
  if (auto v = GetInt(obj, "prompt_logprobs", 0, kMaxLogprobs)) out->prompt_logprobs = static_cast<int32_t>(*v);
  // Known OpenAI fields whose semantics we do not implement: refuse rather than ignore.
  if (const Json* rf = Field(obj, "response_format")) {
    if (!rf->is_object()) Fail("response_format", "'response_format' must be an object");
    const Json* type = Field(*rf, "type");
    if (type == nullptr || !type->is_string()) {
      Fail("response_format.type", "'response_format.type' must be a string");
    }
    if (type->get_ref<const std::string&>() != "text") {
      Fail("response_format.type", "response_format type '" + type->get<std::string>() + "' is not supported");
    }
  }
}

Prompt TokenPrompt(const Json& arr, const std::string& param) {
  if (arr.empty()) Fail(param, "'" + param + "' must not be an empty list of token ids");
  Prompt p;
  p.is_token_ids = true;
  p.token_ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const Json& t = arr[i];
    if (!t.is_number_integer() && !t.is_number_unsigned()) {
      Fail(param, "'" + param + "' must be a string, an array of strings, or an array of token ids");
    }
    p.token_ids.push_back(static_cast<int32_t>(ToInt(t, param + "[" + std::to_string(i) + "]", 0, kInt32Max)));
  }
  return p;
}

std::vector<Prompt> ParsePrompts(const Json& obj) {
  const Json* v = Field(obj, "prompt");
  if (v == nullptr) Fail("prompt", "'prompt' is required");
  std::vector<Prompt> prompts;
  if (v->is_string()) {
    prompts.push_back(Prompt{.text = v->get<std::string>()});
    return prompts;
  }
  constexpr const char* kShape = "'prompt' must be a string, an array of strings, or an array of token ids";
  if (!v->is_array()) Fail("prompt", kShape);
  if (v->empty()) Fail("prompt", "'prompt' must not be empty");
  const Json& first = (*v)[0];
  if (first.is_number()) return {TokenPrompt(*v, "prompt")};
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& e = (*v)[i];
    const std::string param = "prompt[" + std::to_string(i) + "]";
    if (first.is_string() && e.is_string()) {
      prompts.push_back(Prompt{.text = e.get<std::string>()});
    } else if (first.is_array() && e.is_array()) {
      prompts.push_back(TokenPrompt(e, param));
    } else {
      Fail(param, kShape);
    }
  }
  return prompts;
}

std::string ParseModel(const Json& obj) { return GetString(obj, "model").value_or(""); }

void ParseContent(const Json& msg, const std::string& role, const std::string& prefix, ChatMessage* out) {
  const std::string param = prefix + ".content";
  const Json* c = Field(msg, "content");
  if (c == nullptr) {
    // An assistant turn may carry only tool calls; every other turn needs content.
    if (role == "assistant") return;
    Fail(param, "'" + param + "' is required");
  }
  if (c->is_string()) {
    out->content = c->get<std::string>();
    return;
  }
  if (!c->is_array()) Fail(param, "'" + param + "' must be a string or an array of content parts");
  bool first = true;
  for (size_t j = 0; j < c->size(); ++j) {
    const Json& part = (*c)[j];
    const std::string pp = param + "[" + std::to_string(j) + "]";
    if (!part.is_object()) Fail(pp, "'" + pp + "' must be an object");
    const Json* type = Field(part, "type");
    if (type == nullptr || !type->is_string()) Fail(pp + ".type", "'" + pp + ".type' must be a string");
    if (type->get_ref<const std::string&>() != "text") {
      Fail(pp + ".type", "content part type '" + type->get<std::string>() + "' is not supported");
    }
    const Json* text = Field(part, "text");
    if (text == nullptr || !text->is_string()) Fail(pp + ".text", "'" + pp + ".text' must be a string");
    // NOTE: text parts are joined with '\n', as vLLM does.
    if (!first) out->content += '\n';
    out->content += text->get_ref<const std::string&>();
    first = false;
  }
}

std::vector<ChatMessage> ParseMessages(const Json& obj) {
  const Json* v = Field(obj, "messages");
  if (v == nullptr) Fail("messages", "'messages' is required");
  if (!v->is_array()) Fail("messages", "'messages' must be an array");
  if (v->empty()) Fail("messages", "'messages' must not be empty");
  std::vector<ChatMessage> messages;
  messages.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& m = (*v)[i];
    const std::string prefix = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) Fail(prefix, "'" + prefix + "' must be an object");
    ChatMessage msg;
    const Json* role = Field(m, "role");
    if (role == nullptr || !role->is_string()) Fail(prefix + ".role", "'" + prefix + ".role' must be a string");
    msg.role = role->get<std::string>();
    if (msg.role != "system" && msg.role != "developer" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "tool") {
      Fail(prefix + ".role", "unknown role '" + msg.role + "'");
    }
    ParseContent(m, msg.role, prefix, &msg);
    if (const Json* name = Field(m, "name")) {
      if (!name->is_string()) Fail(prefix + ".name", "'" + prefix + ".name' must be a string");
      msg.name = name->get<std::string>();
    }
    if (const Json* id = Field(m, "tool_call_id")) {
      if (!id->is_string()) Fail(prefix + ".tool_call_id", "'" + prefix + ".tool_call_id' must be a string");
      msg.tool_call_id = id->get<std::string>();
    }
    if (const Json* calls = Field(m, "tool_calls")) {
      if (msg.role != "assistant") Fail(prefix + ".tool_calls", "only assistant messages carry 'tool_calls'");
      if (calls->is_array()) msg.num_tool_calls = static_cast<int32_t>(calls->size());
    }
    messages.push_back(std::move(msg));
  }
  return messages;
}

CompletionRequest DoParseCompletion(std::string_view body) {
  const Json root = ParseObject(body);
  CompletionRequest req;
  req.model = ParseModel(root);
  req.prompts = ParsePrompts(root);
  ParseSampling(root, /*chat=*/false, &req.sampling);
  if (auto v = GetInt(root, "logprobs", 0, kMaxLogprobs)) req.logprobs = static_cast<int32_t>(*v);
  req.echo = GetBool(root, "echo", "echo").value_or(false);
  if (req.sampling.max_tokens && *req.sampling.max_tokens == 0 && !req.echo) {
    Fail("max_tokens", "'max_tokens' must be at least 1 (0 is allowed only with 'echo')");
  }
  if (auto suffix = GetString(root, "suffix"); suffix && !suffix->empty()) {
    Fail("suffix", "'suffix' is not supported");
  }
  if (auto best_of = GetInt(root, "best_of", 1, kMaxN)) {
    if (*best_of < req.sampling.n) Fail("best_of", "'best_of' must be at least 'n'");
    if (*best_of > req.sampling.n && req.sampling.stream) {
      Fail("best_of", "'best_of' greater than 'n' cannot be streamed (the best are known only at the end)");
    }
    req.best_of = static_cast<int32_t>(*best_of);
  }
  return req;
}

// The template's view of the messages and tools, from a key-ordered parse of the body
// (`tojson` in a template shows the keys in the client's order).
void ParseToolFields(std::string_view body, ChatCompletionRequest* req) {
  const OJson root = OJson::parse(body.begin(), body.end());
  const OJson* tools = nullptr;
  if (auto it = root.find("tools"); it != root.end() && !it->is_null()) tools = &*it;
  if (tools != nullptr) {
    if (!tools->is_array()) Fail("tools", "'tools' must be an array of tool definitions");
    for (size_t i = 0; i < tools->size(); ++i) {
      const OJson& t = (*tools)[i];
      const std::string param = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) Fail(param, "'" + param + "' must be an object");
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object()) Fail(param + ".function", "'" + param + ".function' must be an object");
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string()) {
        Fail(param + ".function.name", "'" + param + ".function.name' must be a string");
      }
    }
    if (!tools->empty()) req->tools_json = tools->dump();
  }
  if (auto it = root.find("tool_choice"); it != root.end() && !it->is_null()) {
    const bool plain = it->is_string() && (*it == "none" || *it == "auto");
    if (!plain) {
      Fail("tool_choice", "tool_choice must be \"none\" or \"auto\": kvmesh does not constrain decoding to a tool "
                          "call (\"required\" and named functions are not supported)");
    }
    if (req->tools_json.empty() && *it == "auto" && tools == nullptr) {
      Fail("tool_choice", "'tool_choice' requires 'tools'");
    }
  }
  OJson messages = OJson::array();
  const OJson& in = root.at("messages");
  for (size_t i = 0; i < in.size(); ++i) {
    OJson m = in[i];
    const ChatMessage& parsed = req->messages[i];
    const std::string prefix = "messages[" + std::to_string(i) + "]";
    m["role"] = parsed.role == "developer" ? "system" : parsed.role;
    // As vLLM: a null or absent content (an assistant turn of tool calls) is "" to the template.
    m["content"] = parsed.content;
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (!calls->is_array()) Fail(prefix + ".tool_calls", "'" + prefix + ".tool_calls' must be an array");
      for (size_t k = 0; k < calls->size(); ++k) {
        OJson& call = (*calls)[k];
        const std::string cp = prefix + ".tool_calls[" + std::to_string(k) + "]";
        if (!call.is_object()) Fail(cp, "'" + cp + "' must be an object");
        auto fn = call.find("function");
        if (fn == call.end() || !fn->is_object()) Fail(cp + ".function", "'" + cp + ".function' must be an object");
        auto name = fn->find("name");
        if (name == fn->end() || !name->is_string()) Fail(cp + ".function.name", "'" + cp + ".function.name' must be a string");
        // vLLM hands templates the arguments as an object (most index or `tojson` them).
        if (auto args = fn->find("arguments"); args != fn->end() && args->is_string()) {
          try {
            OJson parsed_args = OJson::parse(args->get<std::string>());
            if (parsed_args.is_object()) *args = std::move(parsed_args);
          } catch (const OJson::exception&) {
            Fail(cp + ".function.arguments", "'" + cp + ".function.arguments' must be a JSON object in a string");
          }
        }
      }
    }
    messages.push_back(std::move(m));
  }
  req->template_messages_json = messages.dump();
}

ChatCompletionRequest DoParseChat(std::string_view body) {
  const Json root = ParseObject(body);
  ChatCompletionRequest req;
  req.model = ParseModel(root);
  req.messages = ParseMessages(root);
  ParseSampling(root, /*chat=*/true, &req.sampling);
  req.logprobs = GetBool(root, "logprobs", "logprobs").value_or(false);
  if (auto v = GetInt(root, "top_logprobs", 0, kMaxLogprobs)) {
    if (!req.logprobs) Fail("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
    req.top_logprobs = static_cast<int32_t>(*v);
  }
  if (auto v = GetBool(root, "add_generation_prompt", "add_generation_prompt")) req.add_generation_prompt = *v;
  if (req.sampling.prompt_logprobs) Fail("prompt_logprobs", "'prompt_logprobs' is supported on /v1/completions only");
  ParseToolFields(body, &req);
  return req;
}

// ---- builders ----

double FiniteLogprob(double lp) { return std::isfinite(lp) ? lp : -9999.0; }  // as vLLM does

OJson Bytes(const std::string& s) {
  OJson arr = OJson::array();
  for (char c : s) arr.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return arr;
}

OJson CompletionLogprobs(const Choice& choice) {
  if (!choice.logprobs) return nullptr;
  OJson tokens = OJson::array(), token_logprobs = OJson::array(), top = OJson::array(), offsets = OJson::array();
  int64_t offset = choice.text_offset;
  for (const TokenLogprob& t : *choice.logprobs) {
    tokens.push_back(t.token);
    if (t.null_logprob) {
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
    } else {
      token_logprobs.push_back(FiniteLogprob(t.logprob));
      OJson alts = OJson::object();
      for (const TopLogprob& a : t.top) alts[a.token] = FiniteLogprob(a.logprob);
      top.push_back(std::move(alts));
    }
    offsets.push_back(offset);
    offset += static_cast<int64_t>(t.token.size());
  }
  OJson out;
  out["tokens"] = std::move(tokens);
  out["token_logprobs"] = std::move(token_logprobs);
  out["top_logprobs"] = std::move(top);
  out["text_offset"] = std::move(offsets);
  return out;
}

OJson ChatLogprobs(const Choice& choice) {
  if (!choice.logprobs) return nullptr;
  OJson content = OJson::array();
  for (const TokenLogprob& t : *choice.logprobs) {
    OJson entry;
    entry["token"] = t.token;
    entry["logprob"] = FiniteLogprob(t.logprob);
    entry["bytes"] = Bytes(t.token);
    OJson alts = OJson::array();
    for (const TopLogprob& a : t.top) {
      OJson alt;
      alt["token"] = a.token;
      alt["logprob"] = FiniteLogprob(a.logprob);
      alt["bytes"] = Bytes(a.token);
      alts.push_back(std::move(alt));
    }
    entry["top_logprobs"] = std::move(alts);
    content.push_back(std::move(entry));
  }
  OJson out;
  out["content"] = std::move(content);
  return out;
}

OJson FinishReason(const Choice& c) { return c.finish_reason.empty() ? OJson(nullptr) : OJson(c.finish_reason); }

OJson UsageJson(const Usage& usage) {
  OJson u;
  u["prompt_tokens"] = usage.prompt_tokens;
  u["completion_tokens"] = usage.completion_tokens;
  u["total_tokens"] = static_cast<int64_t>(usage.prompt_tokens) + usage.completion_tokens;
  if (usage.cached_tokens) {
    OJson details;
    details["cached_tokens"] = *usage.cached_tokens;
    u["prompt_tokens_details"] = std::move(details);
  }
  return u;
}

OJson Envelope(const ResponseMeta& meta, std::string_view object) {
  OJson j;
  j["id"] = meta.id;
  j["object"] = object;
  j["created"] = meta.created;
  j["model"] = meta.model;
  return j;
}

std::string Dump(const OJson& j) { return j.dump(-1, ' ', false, OJson::error_handler_t::replace); }
std::string Event(const OJson& j) { return "data: " + Dump(j) + "\n\n"; }

OJson CompletionChoiceJson(const Choice& c) {
  OJson j;
  j["index"] = c.index;
  j["text"] = c.text;
  j["logprobs"] = CompletionLogprobs(c);
  j["finish_reason"] = FinishReason(c);
  if (c.prompt_logprobs) {
    OJson arr = OJson::array();
    arr.push_back(nullptr);  // the first prompt token has no context
    for (const PromptTokenLogprobs& p : *c.prompt_logprobs) {
      OJson entry = OJson::object();
      for (const PromptTokenLogprobs::Entry& e : p.entries) {
        const std::string key = std::to_string(e.token_id);
        if (entry.contains(key)) continue;  // the prompt token is also among its top alternatives
        OJson v;
        v["logprob"] = FiniteLogprob(e.logprob);
        v["rank"] = e.rank;
        v["decoded_token"] = e.decoded_token;
        entry[key] = std::move(v);
      }
      arr.push_back(std::move(entry));
    }
    j["prompt_logprobs"] = std::move(arr);
  }
  return j;
}

TokenizeRequest DoParseTokenize(std::string_view body) {
  const Json root = ParseObject(body);
  TokenizeRequest req;
  req.model = ParseModel(root);
  if (auto v = GetBool(root, "return_token_strs", "return_token_strs")) req.return_token_strs = *v;
  if (Field(root, "messages") != nullptr) {
    req.is_chat = true;
    req.add_special_tokens = false;
    req.chat.messages = ParseMessages(root);
    if (auto v = GetBool(root, "add_generation_prompt", "add_generation_prompt")) req.chat.add_generation_prompt = *v;
    ParseToolFields(body, &req.chat);
  } else {
    const Json* prompt = Field(root, "prompt");
    if (prompt == nullptr || !prompt->is_string()) Fail("prompt", "'prompt' (a string) or 'messages' is required");
    req.prompt = prompt->get<std::string>();
  }
  if (auto v = GetBool(root, "add_special_tokens", "add_special_tokens")) req.add_special_tokens = *v;
  return req;
}

DetokenizeRequest DoParseDetokenize(std::string_view body) {
  const Json root = ParseObject(body);
  DetokenizeRequest req;
  req.model = ParseModel(root);
  const Json* tokens = Field(root, "tokens");
  if (tokens == nullptr || !tokens->is_array()) Fail("tokens", "'tokens' must be an array of token ids");
  for (size_t i = 0; i < tokens->size(); ++i) {
    req.tokens.push_back(static_cast<int32_t>(ToInt((*tokens)[i], "tokens[" + std::to_string(i) + "]", 0, kInt32Max)));
  }
  return req;
}

}  // namespace

std::variant<CompletionRequest, ApiError> ParseCompletionRequest(std::string_view body) {
  try {
    return DoParseCompletion(body);
  } catch (ParseFailure& f) {
    return std::move(f.error);
  } catch (const std::exception& e) {  // nlohmann type errors we did not foresee: still a 400
    return ApiError::Invalid("", std::string("invalid request: ") + e.what());
  }
}

template <typename T, typename F>
std::variant<T, ApiError> Guarded(F&& parse) {
  try {
    return parse();
  } catch (ParseFailure& f) {
    return std::move(f.error);
  } catch (const std::exception& e) {
    return ApiError::Invalid("", std::string("invalid request: ") + e.what());
  }
}

std::variant<TokenizeRequest, ApiError> ParseTokenizeRequest(std::string_view body) {
  return Guarded<TokenizeRequest>([&] { return DoParseTokenize(body); });
}

std::variant<DetokenizeRequest, ApiError> ParseDetokenizeRequest(std::string_view body) {
  return Guarded<DetokenizeRequest>([&] { return DoParseDetokenize(body); });
}

std::string TokenizeResponseJson(const std::vector<int32_t>& tokens, int32_t max_model_len,
                                 const std::vector<std::string>* token_strs) {
  OJson j;
  j["count"] = tokens.size();
  j["max_model_len"] = max_model_len;
  j["tokens"] = tokens;
  j["token_strs"] = token_strs != nullptr ? OJson(*token_strs) : OJson(nullptr);
  return Dump(j);
}

std::string DetokenizeResponseJson(const std::string& prompt) {
  OJson j;
  j["prompt"] = prompt;
  return Dump(j);
}

std::variant<ChatCompletionRequest, ApiError> ParseChatCompletionRequest(std::string_view body) {
  try {
    return DoParseChat(body);
  } catch (ParseFailure& f) {
    return std::move(f.error);
  } catch (const std::exception& e) {
    return ApiError::Invalid("", std::string("invalid request: ") + e.what());
  }
}

std::string CompletionResponseJson(const ResponseMeta& meta, const std::vector<Choice>& choices, const Usage& usage) {
  OJson j = Envelope(meta, "text_completion");
  OJson arr = OJson::array();
  for (const Choice& c : choices) arr.push_back(CompletionChoiceJson(c));
  j["choices"] = std::move(arr);
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string ChatCompletionResponseJson(const ResponseMeta& meta, const std::vector<Choice>& choices,
                                       const Usage& usage) {
  OJson j = Envelope(meta, "chat.completion");
  OJson arr = OJson::array();
  for (const Choice& c : choices) {
    OJson cj;
    cj["index"] = c.index;
    OJson msg;
    msg["role"] = "assistant";
    msg["content"] = c.text;
    cj["message"] = std::move(msg);
    cj["logprobs"] = ChatLogprobs(c);
    cj["finish_reason"] = FinishReason(c);
    arr.push_back(std::move(cj));
  }
  j["choices"] = std::move(arr);
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string CompletionChunkEvent(const ResponseMeta& meta, const Choice& choice, bool with_usage_null) {
  OJson j = Envelope(meta, "text_completion");
  j["choices"] = OJson::array({CompletionChoiceJson(choice)});
  if (with_usage_null) j["usage"] = nullptr;
  return Event(j);
}

std::string ChatCompletionChunkEvent(const ResponseMeta& meta, const Choice& choice, bool role_delta,
                                     bool with_usage_null) {
  OJson j = Envelope(meta, "chat.completion.chunk");
  OJson cj;
  cj["index"] = choice.index;
  OJson delta = OJson::object();
  if (role_delta) delta["role"] = "assistant";
  if (role_delta || !choice.text.empty()) delta["content"] = choice.text;
  cj["delta"] = std::move(delta);
  cj["logprobs"] = ChatLogprobs(choice);
  cj["finish_reason"] = FinishReason(choice);
  j["choices"] = OJson::array({std::move(cj)});
  if (with_usage_null) j["usage"] = nullptr;
  return Event(j);
}

std::string CompletionUsageChunkEvent(const ResponseMeta& meta, const Usage& usage) {
  OJson j = Envelope(meta, "text_completion");
  j["choices"] = OJson::array();
  j["usage"] = UsageJson(usage);
  return Event(j);
}

std::string ChatCompletionUsageChunkEvent(const ResponseMeta& meta, const Usage& usage) {
  OJson j = Envelope(meta, "chat.completion.chunk");
  j["choices"] = OJson::array();
  j["usage"] = UsageJson(usage);
  return Event(j);
}

std::string ErrorEvent(const ApiError& error) { return "data: " + ApiErrorJson(error) + "\n\n"; }

std::string_view DoneEvent() { return "data: [DONE]\n\n"; }

std::string ModelListJson(const std::vector<ModelCard>& models) {
  OJson data = OJson::array();
  for (const ModelCard& m : models) {
    OJson card;
    card["id"] = m.id;
    card["object"] = "model";
    card["created"] = m.created;
    card["owned_by"] = m.owned_by;
    if (m.max_model_len) card["max_model_len"] = *m.max_model_len;
    data.push_back(std::move(card));
  }
  OJson j;
  j["object"] = "list";
  j["data"] = std::move(data);
  return Dump(j);
}

}  // namespace kvmesh::http
