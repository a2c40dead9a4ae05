#include "http/openai_protocol.h"

#include <limits>
#include <string>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "core/cache_salt.h"
#include "http/api_error.h"

namespace kvmesh::http {
namespace {

// ---- Bad input: each → exact status and param ------------------------------------

struct BadCase {
  const char* name;
  bool chat;
  std::string body;
  int32_t status;
  std::string param;
};

std::vector<BadCase> BadCases() {
  return {
      {"malformed_json", false, R"({"prompt": "x",)", 400, ""},
      {"not_an_object", false, R"(["prompt"])", 400, ""},
      {"string_body", true, R"("hello")", 400, ""},
      {"empty_body", false, "", 400, ""},
      {"invalid_utf8_in_string", false, "{\"prompt\": \"bad \xff\xfe\"}", 400, ""},
      {"overlong_utf8", true, "{\"messages\": [{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}", 400, ""},
      {"lone_surrogate_escape", false, R"({"prompt": "\ud800"})", 400, ""},
      {"missing_prompt", false, R"({"model": "m"})", 400, "prompt"},
      {"prompt_number", false, R"({"prompt": 5})", 400, "prompt"},
      {"prompt_empty_array", false, R"({"prompt": []})", 400, "prompt"},
      {"prompt_mixed_array", false, R"({"prompt": ["a", 1]})", 400, "prompt[1]"},
      {"prompt_negative_token", false, R"({"prompt": [1, -2]})", 400, "prompt[1]"},
      {"prompt_float_token", false, R"({"prompt": [1, 2.5]})", 400, "prompt"},
      {"prompt_empty_token_list_in_batch", false, R"({"prompt": [[1], []]})", 400, "prompt[1]"},
      {"model_not_string", false, R"({"prompt": "x", "model": 3})", 400, "model"},
      {"max_tokens_zero", false, R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens"},
      {"max_tokens_string", false, R"({"prompt": "x", "max_tokens": "10"})", 400, "max_tokens"},
      {"max_tokens_fraction", false, R"({"prompt": "x", "max_tokens": 2.5})", 400, "max_tokens"},
      {"max_tokens_too_big", false, R"({"prompt": "x", "max_tokens": 4294967296})", 400, "max_tokens"},
      {"max_completion_tokens_negative", true, R"({"messages":[{"role":"user","content":"x"}], "max_completion_tokens": -1})", 400, "max_completion_tokens"},
      {"temperature_too_high", false, R"({"prompt": "x", "temperature": 2.5})", 400, "temperature"},
      {"temperature_negative", true, R"({"messages":[{"role":"user","content":"x"}], "temperature": -0.1})", 400, "temperature"},
      {"temperature_bool", false, R"({"prompt": "x", "temperature": true})", 400, "temperature"},
      {"top_p_zero", false, R"({"prompt": "x", "top_p": 0})", 400, "top_p"},
      {"top_p_above_one", false, R"({"prompt": "x", "top_p": 1.01})", 400, "top_p"},
      {"top_k_below_minus_one", false, R"({"prompt": "x", "top_k": -2})", 400, "top_k"},
      {"min_p_above_one", false, R"({"prompt": "x", "min_p": 1.5})", 400, "min_p"},
      {"n_zero", false, R"({"prompt": "x", "n": 0})", 400, "n"},
      {"n_too_big", true, R"({"messages":[{"role":"user","content":"x"}], "n": 129})", 400, "n"},
      {"stream_not_bool", false, R"({"prompt": "x", "stream": "yes"})", 400, "stream"},
      {"stream_options_without_stream", false, R"({"prompt": "x", "stream_options": {"include_usage": true}})", 400, "stream_options"},
      {"stream_options_not_object", true, R"({"messages":[{"role":"user","content":"x"}], "stream": true, "stream_options": 1})", 400, "stream_options"},
      {"include_usage_not_bool", false, R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})", 400, "stream_options.include_usage"},
      {"stop_number", false, R"({"prompt": "x", "stop": 7})", 400, "stop"},
      {"stop_array_with_number", false, R"({"prompt": "x", "stop": ["a", 7]})", 400, "stop[1]"},
      {"stop_empty_string", false, R"({"prompt": "x", "stop": ""})", 400, "stop"},
      {"stop_empty_in_array", true, R"({"messages":[{"role":"user","content":"x"}], "stop": ["a", ""]})", 400, "stop[1]"},
      {"stop_too_many", false, R"({"prompt": "x", "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})", 400, "stop"},
      {"seed_string", false, R"({"prompt": "x", "seed": "1"})", 400, "seed"},
      {"logprobs_too_many", false, R"({"prompt": "x", "logprobs": 21})", 400, "logprobs"},
      {"logprobs_bool_on_completions", false, R"({"prompt": "x", "logprobs": true})", 400, "logprobs"},
      {"chat_logprobs_int", true, R"({"messages":[{"role":"user","content":"x"}], "logprobs": 3})", 400, "logprobs"},
      {"top_logprobs_without_logprobs", true, R"({"messages":[{"role":"user","content":"x"}], "top_logprobs": 2})", 400, "top_logprobs"},
      {"top_logprobs_too_many", true, R"({"messages":[{"role":"user","content":"x"}], "logprobs": true, "top_logprobs": 21})", 400, "top_logprobs"},
      {"presence_penalty_out_of_range", false, R"({"prompt": "x", "presence_penalty": 2.1})", 400, "presence_penalty"},
      {"frequency_penalty_out_of_range", true, R"({"messages":[{"role":"user","content":"x"}], "frequency_penalty": -3})", 400, "frequency_penalty"},
      {"repetition_penalty_zero", false, R"({"prompt": "x", "repetition_penalty": 0})", 400, "repetition_penalty"},
      {"ignore_eos_not_bool", false, R"({"prompt": "x", "ignore_eos": 1})", 400, "ignore_eos"},
      {"user_not_string", true, R"({"messages":[{"role":"user","content":"x"}], "user": 42})", 400, "user"},
      {"suffix_set", false, R"({"prompt": "x", "suffix": "tail"})", 400, "suffix"},
      {"cache_salt_empty", false, R"({"prompt": "x", "cache_salt": ""})", 400, "cache_salt"},
      {"cache_salt_number", false, R"({"prompt": "x", "cache_salt": 7})", 400, "cache_salt"},
      {"chat_cache_salt_empty", true, R"({"messages":[{"role":"user","content":"x"}], "cache_salt": ""})", 400, "cache_salt"},
      {"chat_cache_salt_object", true, R"({"messages":[{"role":"user","content":"x"}], "cache_salt": {"a": 1}})", 400, "cache_salt"},
      {"logit_bias_not_object", false, R"({"prompt": "x", "logit_bias": [1]})", 400, "logit_bias"},
      {"logit_bias_key_not_id", false, R"({"prompt": "x", "logit_bias": {"abc": 1}})", 400, "logit_bias.abc"},
      {"logit_bias_negative_key", true, R"({"messages":[{"role":"user","content":"x"}], "logit_bias": {"-3": 1}})", 400, "logit_bias.-3"},
      {"logit_bias_too_low", false, R"({"prompt": "x", "logit_bias": {"5": -101}})", 400, "logit_bias.5"},
      {"logit_bias_not_number", false, R"({"prompt": "x", "logit_bias": {"5": "ban"}})", 400, "logit_bias.5"},
      {"prompt_logprobs_too_many", false, R"({"prompt": "x", "prompt_logprobs": 21})", 400, "prompt_logprobs"},
      {"echo_not_bool", false, R"({"prompt": "x", "echo": 1})", 400, "echo"},
      {"max_tokens_zero_without_echo", false, R"({"prompt": "x", "max_tokens": 0, "echo": false})", 400, "max_tokens"},
      {"chat_max_tokens_zero", true, R"({"messages":[{"role":"user","content":"x"}], "max_tokens": 0})", 400, "max_tokens"},
      {"best_of_below_n", false, R"({"prompt": "x", "n": 3, "best_of": 2})", 400, "best_of"},
      {"best_of_streamed", false, R"({"prompt": "x", "best_of": 2, "stream": true})", 400, "best_of"},
      {"chat_prompt_logprobs_set", true, R"({"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 0})", 400, "prompt_logprobs"},
      {"response_format_json", true, R"({"messages":[{"role":"user","content":"x"}], "response_format": {"type": "json_object"}})", 400, "response_format.type"},
      {"missing_messages", true, R"({"model": "m"})", 400, "messages"},
      {"messages_not_array", true, R"({"messages": "hi"})", 400, "messages"},
      {"messages_empty", true, R"({"messages": []})", 400, "messages"},
      {"message_not_object", true, R"({"messages": ["hi"]})", 400, "messages[0]"},
      {"message_missing_role", true, R"({"messages": [{"content": "x"}]})", 400, "messages[0].role"},
      {"message_unknown_role", true, R"({"messages": [{"role":"user","content":"x"}, {"role": "wizard", "content": "x"}]})", 400, "messages[1].role"},
      {"message_missing_content", true, R"({"messages": [{"role": "user"}]})", 400, "messages[0].content"},
      {"message_content_number", true, R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages[0].content"},
      {"content_part_image", true, R"({"messages": [{"role": "user", "content": [{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]})", 400, "messages[0].content[1].type"},
      {"content_part_missing_text", true, R"({"messages": [{"role": "user", "content": [{"type":"text"}]}]})", 400, "messages[0].content[0].text"},
      {"message_name_not_string", true, R"({"messages": [{"role": "user", "content": "x", "name": 1}]})", 400, "messages[0].name"},
      {"tools_not_array", true, R"({"messages":[{"role":"user","content":"x"}], "tools": {"type":"function"}})", 400, "tools"},
      {"tool_without_function", true, R"({"messages":[{"role":"user","content":"x"}], "tools": [{"type":"function"}]})", 400, "tools[0].function"},
      {"tool_without_name", true, R"({"messages":[{"role":"user","content":"x"}], "tools": [{"type":"function","function":{}}]})", 400, "tools[0].function.name"},
      {"tool_choice_required", true, R"({"messages":[{"role":"user","content":"x"}], "tools": [{"type":"function","function":{"name":"f"}}], "tool_choice": "required"})", 400, "tool_choice"},
      {"tool_choice_named", true, R"({"messages":[{"role":"user","content":"x"}], "tools": [{"type":"function","function":{"name":"f"}}], "tool_choice": {"type":"function","function":{"name":"f"}}})", 400, "tool_choice"},
      {"tool_calls_not_array", true, R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":{}}]})", 400, "messages[1].tool_calls"},
      {"tool_calls_on_user", true, R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", 400, "messages[0].tool_calls"},
      {"tool_call_without_name", true, R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"arguments":"{}"}}]}]})", 400, "messages[1].tool_calls[0].function.name"},
      {"tool_call_arguments_not_json", true, R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{oops"}}]}]})", 400, "messages[1].tool_calls[0].function.arguments"},
      {"tool_call_id_not_string", true, R"({"messages":[{"role":"tool","content":"x","tool_call_id":5}]})", 400, "messages[0].tool_call_id"},
  };
}

class BadRequestTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadRequestTest, ReturnsExactStatusAndParam) {
  const BadCase& c = GetParam();
  ApiError error;
  if (c.chat) {
    auto r = ParseChatCompletionRequest(c.body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted: " << c.body;
    error = std::get<ApiError>(r);
  } else {
    auto r = ParseCompletionRequest(c.body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted: " << c.body;
    error = std::get<ApiError>(r);
  }
  EXPECT_EQ(error.http_status, c.status);
  EXPECT_EQ(error.param, c.param) << error.message;
  EXPECT_EQ(error.type, "invalid_request_error");
  EXPECT_FALSE(error.message.empty());
}

INSTANTIATE_TEST_SUITE_P(OpenAiProtocol, BadRequestTest, ::testing::ValuesIn(BadCases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

// ---- Good input ----------------------------------------------------------------------

TEST(OpenAiProtocolTest, ParsesFullCompletionRequest) {
  auto r = ParseCompletionRequest(R"({
    "model": "tiny", "prompt": "Hello", "max_tokens": 16, "temperature": 0.5, "top_p": 0.9,
    "top_k": 40, "min_p": 0.05, "n": 2, "stream": true, "stream_options": {"include_usage": true},
    "stop": ["\n", "END"], "seed": -7, "logprobs": 3, "presence_penalty": 0.5,
    "frequency_penalty": -0.5, "repetition_penalty": 1.1, "ignore_eos": true, "user": "u1",
    "echo": false, "best_of": 2, "some_future_field": {"x": [1, 2]}})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r)) << std::get<ApiError>(r).message;
  const auto& req = std::get<CompletionRequest>(r);
  EXPECT_EQ(req.model, "tiny");
  ASSERT_EQ(req.prompts.size(), 1u);
  EXPECT_EQ(req.prompts[0].text, "Hello");
  EXPECT_FALSE(req.prompts[0].is_token_ids);
  const SamplingFields& s = req.sampling;
  EXPECT_EQ(s.max_tokens, 16);
  EXPECT_EQ(s.temperature, 0.5);
  EXPECT_EQ(s.top_p, 0.9);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_EQ(s.min_p, 0.05);
  EXPECT_EQ(s.n, 2);
  EXPECT_TRUE(s.stream);
  EXPECT_TRUE(s.include_usage);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_EQ(s.seed, -7);
  EXPECT_EQ(req.logprobs, 3);
  EXPECT_EQ(s.presence_penalty, 0.5);
  EXPECT_EQ(s.frequency_penalty, -0.5);
  EXPECT_EQ(s.repetition_penalty, 1.1);
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_EQ(s.user, "u1");
}

TEST(OpenAiProtocolTest, DefaultsWhenFieldsAbsentOrNull) {
  auto r = ParseCompletionRequest(R"({"prompt": "x", "max_tokens": null, "temperature": null, "stop": null})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r));
  const auto& req = std::get<CompletionRequest>(r);
  EXPECT_EQ(req.model, "");
  EXPECT_FALSE(req.sampling.max_tokens.has_value());
  EXPECT_FALSE(req.sampling.temperature.has_value());
  EXPECT_EQ(req.sampling.n, 1);
  EXPECT_FALSE(req.sampling.stream);
  EXPECT_TRUE(req.sampling.stop.empty());
  EXPECT_FALSE(req.logprobs.has_value());
}

TEST(OpenAiProtocolTest, TokenIdPromptsAndBatches) {
  auto r = ParseCompletionRequest(R"({"prompt": [1, 2, 3]})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r));
  const auto& one = std::get<CompletionRequest>(r);
  ASSERT_EQ(one.prompts.size(), 1u);
  EXPECT_TRUE(one.prompts[0].is_token_ids);
  EXPECT_EQ(one.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));

  auto b = ParseCompletionRequest(R"({"prompt": [[5], [6, 7]]})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(b));
  EXPECT_EQ(std::get<CompletionRequest>(b).prompts.size(), 2u);
  EXPECT_EQ(std::get<CompletionRequest>(b).prompts[1].token_ids, (std::vector<int32_t>{6, 7}));

  auto s = ParseCompletionRequest(R"({"prompt": ["a", "b"]})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(s));
  EXPECT_EQ(std::get<CompletionRequest>(s).prompts[1].text, "b");
}

TEST(OpenAiProtocolTest, StopAsSingleStringAndUnicode) {
  auto r = ParseCompletionRequest(R"({"prompt": "x", "stop": "\u4e16\u754c"})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r));
  EXPECT_EQ(std::get<CompletionRequest>(r).sampling.stop, (std::vector<std::string>{"世界"}));
}

TEST(OpenAiProtocolTest, ParsesChatRequestWithContentParts) {
  auto r = ParseChatCompletionRequest(R"({
    "model": "tiny",
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}], "name": "bob"},
      {"role": "assistant", "content": null},
      {"role": "user", "content": "again"}],
    "max_tokens": 5, "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 4})");
  ASSERT_TRUE(std::holds_alternative<ChatCompletionRequest>(r)) << std::get<ApiError>(r).message;
  const auto& req = std::get<ChatCompletionRequest>(r);
  ASSERT_EQ(req.messages.size(), 4u);
  EXPECT_EQ(req.messages[0].role, "system");
  EXPECT_EQ(req.messages[1].content, "Hi\nthere");
  EXPECT_EQ(req.messages[1].name, "bob");
  EXPECT_EQ(req.messages[2].content, "");
  EXPECT_EQ(req.sampling.max_tokens, 9);  // max_completion_tokens wins
  EXPECT_TRUE(req.logprobs);
  EXPECT_EQ(req.top_logprobs, 4);
}

TEST(OpenAiProtocolTest, ChatToolsWithChoiceNoneAreAccepted) {
  auto r = ParseChatCompletionRequest(
      R"({"messages":[{"role":"user","content":"x"}], "tools": [{"type":"function","function":{"name":"f"}}], "tool_choice": "none"})");
  EXPECT_TRUE(std::holds_alternative<ChatCompletionRequest>(r));
}

// The template sees tools and messages in the client's key order, tool_calls' string
// arguments as objects (as vLLM hands them over), developer as system.
TEST(OpenAiProtocolTest, ChatToolFieldsReachTheTemplateInKeyOrder) {
  auto r = ParseChatCompletionRequest(R"({"messages":[
      {"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"user","content":"weather?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"a\": 1}"}}]},
      {"role":"tool","tool_call_id":"c1","name":"get_weather","content":"21 C"}],
    "tools":[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object"}}}],
    "tool_choice":"auto"})");
  ASSERT_TRUE(std::holds_alternative<ChatCompletionRequest>(r)) << std::get<ApiError>(r).message;
  const auto& req = std::get<ChatCompletionRequest>(r);
  EXPECT_EQ(req.tools_json,
            R"([{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object"}}}])");
  EXPECT_EQ(req.template_messages_json,
            R"([{"role":"system","content":"a\nb"},{"role":"user","content":"weather?"},)"
            R"({"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function",)"
            R"("function":{"name":"get_weather","arguments":{"city":"Paris","a":1}}}]},)"
            R"({"role":"tool","tool_call_id":"c1","name":"get_weather","content":"21 C"}])");
  EXPECT_EQ(req.messages[2].num_tool_calls, 1);
  EXPECT_EQ(req.messages[3].tool_call_id, "c1");
}

TEST(OpenAiProtocolTest, ParsesEchoLogitBiasBestOfAndPromptLogprobs) {
  auto r = ParseCompletionRequest(
      R"({"prompt": "x", "echo": true, "max_tokens": 0, "logprobs": 1, "prompt_logprobs": 2,
          "logit_bias": {"7": -100, "3": 2.5}, "n": 2, "best_of": 4})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r)) << std::get<ApiError>(r).message;
  const auto& req = std::get<CompletionRequest>(r);
  EXPECT_TRUE(req.echo);
  EXPECT_EQ(req.sampling.max_tokens, 0);
  EXPECT_EQ(req.logprobs, 1);
  EXPECT_EQ(req.sampling.prompt_logprobs, 2);
  EXPECT_EQ(req.best_of, 4);
  ASSERT_EQ(req.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(req.sampling.logit_bias[0].first + req.sampling.logit_bias[1].first, 10);
}

TEST(OpenAiProtocolTest, CacheSaltIsANonEmptyBoundedString) {
  auto completion = ParseCompletionRequest(R"({"prompt": "x", "cache_salt": "tenant-a"})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(completion)) << std::get<ApiError>(completion).message;
  EXPECT_EQ(std::get<CompletionRequest>(completion).sampling.cache_salt, "tenant-a");
  auto chat = ParseChatCompletionRequest(R"({"messages":[{"role":"user","content":"x"}], "cache_salt": "t"})");
  ASSERT_TRUE(std::holds_alternative<ChatCompletionRequest>(chat)) << std::get<ApiError>(chat).message;
  EXPECT_EQ(std::get<ChatCompletionRequest>(chat).sampling.cache_salt, "t");
  // null is absent, as for every field.
  auto null_salt = ParseCompletionRequest(R"({"prompt": "x", "cache_salt": null})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(null_salt));
  EXPECT_EQ(std::get<CompletionRequest>(null_salt).sampling.cache_salt, "");

  const std::string longest(kMaxCacheSaltBytes, 's');
  auto at_bound = ParseCompletionRequest(R"({"prompt": "x", "cache_salt": ")" + longest + R"("})");
  EXPECT_TRUE(std::holds_alternative<CompletionRequest>(at_bound));
  auto too_long = ParseCompletionRequest(R"({"prompt": "x", "cache_salt": ")" + longest + R"(s"})");
  ASSERT_TRUE(std::holds_alternative<ApiError>(too_long));
  const ApiError& error = std::get<ApiError>(too_long);
  EXPECT_EQ(error.http_status, 400);
  EXPECT_EQ(error.param, "cache_salt");
  EXPECT_NE(error.message.find("'cache_salt' must be at most 1024 bytes"), std::string::npos) << error.message;
  auto empty = ParseCompletionRequest(R"({"prompt": "x", "cache_salt": ""})");
  EXPECT_EQ(std::get<ApiError>(empty).message, "Parameter 'cache_salt' must be a non-empty string if provided.");
}

TEST(OpenAiProtocolTest, TokenizeAndDetokenizeShapes) {
  auto t = ParseTokenizeRequest(R"({"prompt": "hi", "add_special_tokens": false, "return_token_strs": true})");
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(t));
  EXPECT_EQ(std::get<TokenizeRequest>(t).prompt, "hi");
  EXPECT_FALSE(std::get<TokenizeRequest>(t).add_special_tokens);
  EXPECT_TRUE(std::get<TokenizeRequest>(t).return_token_strs);
  auto chat = ParseTokenizeRequest(R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(chat));
  EXPECT_TRUE(std::get<TokenizeRequest>(chat).is_chat);
  EXPECT_FALSE(std::get<TokenizeRequest>(chat).add_special_tokens);  // vLLM's default for messages
  auto bad = ParseTokenizeRequest(R"({"prompt": 3})");
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad));
  EXPECT_EQ(std::get<ApiError>(bad).param, "prompt");
  auto d = ParseDetokenizeRequest(R"({"tokens": [1, 2, 3]})");
  ASSERT_TRUE(std::holds_alternative<DetokenizeRequest>(d));
  EXPECT_EQ(std::get<DetokenizeRequest>(d).tokens, (std::vector<int32_t>{1, 2, 3}));
  auto bad_d = ParseDetokenizeRequest(R"({"tokens": [1, -2]})");
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad_d));
  EXPECT_EQ(std::get<ApiError>(bad_d).param, "tokens[1]");
  EXPECT_EQ(TokenizeResponseJson({5, 6}, 2048, nullptr),
            R"({"count":2,"max_model_len":2048,"tokens":[5,6],"token_strs":null})");
  EXPECT_EQ(DetokenizeResponseJson("hi"), R"({"prompt":"hi"})");
}

TEST(OpenAiProtocolTest, EchoedFirstTokenRendersNullLogprob) {
  Choice c;
  c.text = "ab";
  c.logprobs.emplace();
  c.logprobs->push_back({.token = "a", .logprob = 0, .top = {}, .null_logprob = true});
  c.logprobs->push_back({.token = "b", .logprob = -1.5, .top = {{"b", -1.5}}});
  const std::string json = CompletionResponseJson({.id = "cmpl-1", .created = 1, .model = "m"}, {c}, {});
  EXPECT_NE(json.find(R"("token_logprobs":[null,-1.5])"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("top_logprobs":[null,{"b":-1.5}])"), std::string::npos) << json;
}

// ---- Errors and Status mapping -----------------------------------------------------

TEST(ApiErrorTest, StatusCodeMapping) {
  EXPECT_EQ(HttpStatusFromStatusCode(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFromStatusCode(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatusFromStatusCode(absl::StatusCode::kPermissionDenied), 403);
  EXPECT_EQ(HttpStatusFromStatusCode(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFromStatusCode(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatusFromStatusCode(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFromStatusCode(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusFromStatusCode(absl::StatusCode::kInternal), 500);
  EXPECT_EQ(HttpStatusFromStatusCode(absl::StatusCode::kCancelled), 500);
  EXPECT_EQ(HttpStatusFromStatusCode(absl::StatusCode::kFailedPrecondition), 500);
}

TEST(ApiErrorTest, FromStatusGolden) {
  ApiError e = ApiErrorFromStatus(absl::ResourceExhaustedError("queue full"));
  EXPECT_EQ(ApiErrorJson(e),
            R"({"error":{"message":"queue full","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}})");
  ApiError n = ApiErrorFromStatus(absl::NotFoundError("model 'x' not found"), "model");
  EXPECT_EQ(n.http_status, 404);
  EXPECT_EQ(ApiErrorJson(n),
            R"({"error":{"message":"model 'x' not found","type":"not_found_error","param":"model","code":null}})");
  ApiError i = ApiErrorFromStatus(absl::InvalidArgumentError("prompt too long"), "prompt");
  EXPECT_EQ(ApiErrorJson(i),
            R"({"error":{"message":"prompt too long","type":"invalid_request_error","param":"prompt","code":null}})");
  EXPECT_EQ(ApiErrorFromStatus(absl::UnavailableError("x")).type, "service_unavailable_error");
  EXPECT_EQ(ApiErrorFromStatus(absl::InternalError("x")).type, "server_error");
  EXPECT_EQ(ApiErrorFromStatus(absl::OkStatus()).http_status, 500);
}

TEST(ApiErrorTest, InvalidUtf8InMessageIsReplacedNotThrown) {
  ApiError e = ApiError::Invalid("prompt", "bad \xff byte");
  const std::string json = ApiErrorJson(e);
  EXPECT_NE(json.find("bad \xef\xbf\xbd byte"), std::string::npos) << json;
}

// ---- Response JSON goldens ----------------------------------------------------------

ResponseMeta Meta(std::string id) { return ResponseMeta{.id = std::move(id), .created = 1700000000, .model = "tiny"}; }

TEST(OpenAiResponseTest, CompletionGolden) {
  Choice c{.index = 0, .text = "Hi \"there\"\n", .finish_reason = "length"};
  EXPECT_EQ(CompletionResponseJson(Meta("cmpl-1"), {c}, Usage{.prompt_tokens = 5, .completion_tokens = 3}),
            R"({"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"tiny","choices":[)"
            R"({"index":0,"text":"Hi \"there\"\n","logprobs":null,"finish_reason":"length"}],)"
            R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}})");
}

TEST(OpenAiResponseTest, CompletionWithLogprobsAndCachedTokensGolden) {
  Choice c{.index = 1, .text = "ab", .finish_reason = "stop"};
  c.logprobs = std::vector<TokenLogprob>{
      {.token = "a", .logprob = -0.5, .top = {{"a", -0.5}, {"b", -1.25}}},
      {.token = "b", .logprob = -std::numeric_limits<double>::infinity(), .top = {}}};
  c.text_offset = 10;
  EXPECT_EQ(
      CompletionResponseJson(Meta("cmpl-2"), {c}, Usage{.prompt_tokens = 4, .completion_tokens = 2, .cached_tokens = 16}),
      R"({"id":"cmpl-2","object":"text_completion","created":1700000000,"model":"tiny","choices":[)"
      R"({"index":1,"text":"ab","logprobs":{"tokens":["a","b"],"token_logprobs":[-0.5,-9999.0],)"
      R"("top_logprobs":[{"a":-0.5,"b":-1.25},{}],"text_offset":[10,11]},"finish_reason":"stop"}],)"
      R"("usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6,"prompt_tokens_details":{"cached_tokens":16}}})");
}

TEST(OpenAiResponseTest, ChatCompletionGolden) {
  Choice c{.index = 0, .text = "Hello!", .finish_reason = "stop"};
  c.logprobs = std::vector<TokenLogprob>{{.token = "Hi", .logprob = -0.25, .top = {{"Hi", -0.25}}}};
  EXPECT_EQ(ChatCompletionResponseJson(Meta("chatcmpl-1"), {c}, Usage{.prompt_tokens = 7, .completion_tokens = 2}),
            R"({"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"tiny","choices":[)"
            R"({"index":0,"message":{"role":"assistant","content":"Hello!"},"logprobs":{"content":[)"
            R"({"token":"Hi","logprob":-0.25,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.25,"bytes":[72,105]}]}]},)"
            R"("finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}})");
}

TEST(OpenAiResponseTest, ChatStreamingChunksGolden) {
  const ResponseMeta m = Meta("chatcmpl-9");
  EXPECT_EQ(ChatCompletionChunkEvent(m, Choice{.index = 0, .text = ""}, /*role_delta=*/true, false),
            "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
            "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
            "\"logprobs\":null,\"finish_reason\":null}]}\n\n");
  EXPECT_EQ(ChatCompletionChunkEvent(m, Choice{.index = 0, .text = "Hi"}, false, /*with_usage_null=*/true),
            "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
            "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},"
            "\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n");
  EXPECT_EQ(ChatCompletionChunkEvent(m, Choice{.index = 0, .finish_reason = "stop"}, false, false),
            "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
            "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n");
  EXPECT_EQ(ChatCompletionUsageChunkEvent(m, Usage{.prompt_tokens = 3, .completion_tokens = 1, .cached_tokens = 0}),
            "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
            "\"model\":\"tiny\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,"
            "\"total_tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n");
  EXPECT_EQ(DoneEvent(), "data: [DONE]\n\n");
}

TEST(OpenAiResponseTest, CompletionStreamingChunksGolden) {
  const ResponseMeta m = Meta("cmpl-9");
  EXPECT_EQ(CompletionChunkEvent(m, Choice{.index = 2, .text = "tok"}, false),
            "data: {\"id\":\"cmpl-9\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"tiny\","
            "\"choices\":[{\"index\":2,\"text\":\"tok\",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
  EXPECT_EQ(CompletionUsageChunkEvent(m, Usage{.prompt_tokens = 1, .completion_tokens = 2}),
            "data: {\"id\":\"cmpl-9\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"tiny\","
            "\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}\n\n");
  EXPECT_EQ(ErrorEvent(ApiErrorFromStatus(absl::InternalError("boom"))),
            "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n");
}

TEST(OpenAiResponseTest, ModelListGolden) {
  EXPECT_EQ(ModelListJson({ModelCard{.id = "tiny", .created = 1, .max_model_len = 2048}, ModelCard{.id = "b", .created = 2}}),
            R"({"object":"list","data":[{"id":"tiny","object":"model","created":1,"owned_by":"kvmesh","max_model_len":2048},)"
            R"({"id":"b","object":"model","created":2,"owned_by":"kvmesh"}]})");
}

}  // namespace
}  // namespace kvmesh::http
