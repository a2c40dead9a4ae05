// Chat templates against renderings of the real Jinja templates (made by
// tools/make-tokenizer-fixtures with jinja2, as transformers renders them).
#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer_test_util.h"

namespace kvmesh::model {
namespace {

using json = nlohmann::json;

TEST(ChatTemplateTest, MatchesJinjaRenderings) {
  std::string text;
  ASSERT_TRUE(testing::ReadFile(testing::FixtureDir() + "/chat_templates.jsonl", &text));
  std::istringstream lines(text);
  std::string line;
  int checked = 0, errors = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const json c = json::parse(line);
    auto tmpl = ChatTemplate::FromName(c["kind"]);
    ASSERT_TRUE(tmpl.ok());
    std::vector<ChatMessage> messages;
    for (const json& m : c["messages"]) messages.push_back({m["role"], m["content"]});
    auto got = tmpl->Apply(messages, c["add_generation_prompt"], c["bos_token"], c["eos_token"]);
    ++checked;
    if (c.contains("error")) {
      ++errors;
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << line;
    } else {
      ASSERT_TRUE(got.ok()) << got.status() << "\n" << line;
      EXPECT_EQ(*got, c["expected"].get<std::string>()) << line;
    }
  }
  EXPECT_GE(checked, 200);
  EXPECT_GT(errors, 0);
}

TEST(ChatTemplateTest, CompilesTheBuiltInFamiliesFromTheirJinja) {
  std::string text;
  ASSERT_TRUE(testing::ReadFile(testing::FixtureDir() + "/chat_templates.jinja.json", &text));
  const json templates = json::parse(text);
  const std::vector<ChatMessage> conv = {{"system", "S"}, {"user", "Hi"}};
  for (const char* name : {"llama3", "chatml"}) {
    auto from_source = ChatTemplate::FromJinja(templates[name].get<std::string>());
    ASSERT_TRUE(from_source.ok()) << from_source.status();
    EXPECT_EQ(from_source->Apply(conv, true, "<s>", "</s>").value(),
              ChatTemplate::FromName(name)->Apply(conv, true, "<s>", "</s>").value());
  }
  // Any Jinja compiles now, not only the three families.
  EXPECT_EQ(ChatTemplate::FromJinja("{{ messages | length }}").value().Apply(conv, false).value(), "2");
}

TEST(ChatTemplateTest, UnsupportedConstructsFailAtLoadNamingTheLine) {
  auto t = ChatTemplate::FromJinja("ok\n{% for m in messages %}\n{% include 'x.jinja' %}{% endfor %}");
  ASSERT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("line 3"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("'include'"), std::string::npos) << t.status();
  auto f = ChatTemplate::FromJinja("{{ x | frobnicate }}");
  EXPECT_NE(f.status().message().find("no filter named 'frobnicate'"), std::string::npos) << f.status();
  EXPECT_EQ(ChatTemplate::FromJinja("{% if x %}no end").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChatTemplate::FromJinja("{{ 'unterminated }}").status().code(), absl::StatusCode::kInvalidArgument);
}

// Integer arithmetic is 64-bit (Python's is unbounded): what does not fit is a clear
// error, and neither a huge exponent nor a huge repetition runs or allocates without
// bound (the chat_template fuzzer timed out on `{% if 0**5000000000000000000 %}`), nor
// does a width.
TEST(ChatTemplateTest, ArithmeticAndWidthsThatWouldRunAwayAreBoundedOrRefused) {
  const std::vector<ChatMessage> none;
  auto render = [&](const std::string& source) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::FromJinja(source);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? t->Apply(none, false) : absl::StatusOr<std::string>(t.status());
  };
  // Each source renders to InvalidArgument with `why` in the message.
  auto expect_refused = [&](std::initializer_list<const char*> sources, const std::string& why) {
    for (const char* source : sources) {
      absl::StatusOr<std::string> got = render(source);
      ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << source;
      EXPECT_NE(got.status().message().find(why), std::string::npos) << got.status();
    }
  };
  EXPECT_EQ(render("{{ 0 ** 5000000000000000000 }}").value(), "0");
  EXPECT_EQ(render("{{ 1 ** 5000000000000000000 }}").value(), "1");
  EXPECT_EQ(render("{{ (-1) ** 5000000000000000001 }}").value(), "-1");
  EXPECT_EQ(render("{{ 3 ** 39 }}").value(), "4052555153018976267");
  EXPECT_EQ(render("{{ 2 ** 62 }}").value(), "4611686018427387904");
  expect_refused({"{{ 2 ** 63 }}", "{{ 3 ** 5000000000000000000 }}", "{{ 9223372036854775807 + 1 }}",
                  "{{ -9223372036854775807 - 2 }}", "{{ 4294967296 * 4294967296 }}",
                  "{{ (-9223372036854775807 - 1) // -1 }}"},
                 "integer overflow");
  EXPECT_EQ(render("{{ 'ab' * 3 }}").value(), "ababab");
  EXPECT_EQ(render("{{ '' * 5000000000000000000 }}").value(), "");
  EXPECT_EQ(render("{{ ([] * 5000000000000000000) | length }}").value(), "0");
  expect_refused({"{{ 'ab' * 5000000000000000000 }}", "{{ ([1, 2] * 1000000) | length }}"}, "repetition too big");
  // Work without bound: nested loops, and a macro that calls itself twice per level.
  expect_refused({"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                  "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}"},
                 "loop iterations and macro calls");
  EXPECT_EQ(render("{% for i in range(1000) %}{% for j in range(100) %}{% endfor %}{% endfor %}ok").value(), "ok");
  // Widths that would pad without bound.
  EXPECT_EQ(render("{{ 'a' | center(5) }}").value(), "  a  ");
  EXPECT_EQ(render("{{ 'a\nb' | indent(2) }}").value(), "a\n  b");
  expect_refused({"{{ 'a' | center(5000000000000000000) }}", "{{ 'a\nb' | indent(5000000000000000000) }}",
                  "{{ [1] | tojson(indent=5000000000000000000) }}"},
                 "too big");
}

// Nesting that would overflow the stack fails with a clear error (the chat_template
// fuzzer overflowed ASan's stack on `{% if 1000 * 5000 ------...-- %}`): deep unary
// operators, `not`s and parentheses at parse time; a long left-associative chain,
// which the parser builds in a loop, when it is evaluated.
TEST(ChatTemplateTest, ExpressionsNestedTooDeeplyAreRefusedNotOverflowed) {
  const std::vector<ChatMessage> none;
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  for (const std::string& source : {"{% if 1000 *5000" + repeat("-", 5000) + "1 %}x{% endif %}",
                                    "{{ " + repeat("not ", 5000) + "x }}",
                                    "{{ " + repeat("(", 5000) + "1" + repeat(")", 5000) + " }}"}) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::FromJinja(source);
    ASSERT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << source.substr(0, 40);
    EXPECT_NE(t.status().message().find("nested more than"), std::string::npos) << t.status();
  }
  absl::StatusOr<ChatTemplate> chain = ChatTemplate::FromJinja("{{ 1" + repeat(" - 1", 5000) + " }}");
  ASSERT_TRUE(chain.ok()) << chain.status();
  absl::StatusOr<std::string> got = chain->Apply(none, false);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("nested more than"), std::string::npos) << got.status();
  // A macro called from deep inside a chain stacks its body's expressions on top: the
  // bound is on the whole render's stack, not per call.
  absl::StatusOr<ChatTemplate> nested =
      ChatTemplate::FromJinja("{% macro f(n) %}{{ f(n - 1)" + repeat(" - 1", 150) + " }}{% endmacro %}{{ f(60) }}");
  ASSERT_TRUE(nested.ok()) << nested.status();
  got = nested->Apply(none, false);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("nested more than"), std::string::npos) << got.status();
  // A runaway recursion is reported as one.
  absl::StatusOr<ChatTemplate> recursive = ChatTemplate::FromJinja("{% macro f(n) %}{{ f(n - 1) }}{% endmacro %}{{ f(1) }}");
  ASSERT_TRUE(recursive.ok()) << recursive.status();
  got = recursive->Apply(none, false);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("recursed too deeply"), std::string::npos) << got.status();
  // Real depths still render.
  EXPECT_EQ(ChatTemplate::FromJinja("{{ " + repeat("-", 50) + "1 }}{{ 1" + repeat(" - 1", 50) + " }}")
                .value()
                .Apply(none, false)
                .value(),
            "1-49");
}

TEST(ChatTemplateTest, FromNameRejectsUnknown) {
  EXPECT_TRUE(ChatTemplate::FromName("chatml").ok());
  EXPECT_EQ(ChatTemplate::FromName("vicuna").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, TheTemplateDecidesWhichRolesItAccepts) {
  // As in transformers, roles are the template's business: llama3's renders any
  // role, mistral's raises on roles out of order (with the template's message).
  auto t = ChatTemplate::FromName("llama3").value();
  EXPECT_EQ(t.Apply({}, true, "<|begin_of_text|>").value(), "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(t.Apply({{"tool", "hi"}}, false, "").value(), "<|start_header_id|>tool<|end_header_id|>\n\nhi<|eot_id|>");
  auto m = ChatTemplate::FromName("mistral").value();
  auto bad = m.Apply({{"user", "a"}, {"user", "b"}}, false, "<s>");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("Conversation roles must alternate"), std::string::npos) << bad.status();
  EXPECT_EQ(m.Apply({{"user", "a"}, {"assistant", "b"}}, false, "<s>").value(), "<s>[INST] a [/INST]b</s>");
}

TEST(ChatTemplateTest, FromModelDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / ("kvmesh_chat_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "{% for m in messages %}<|im_start|>{{ m }}{% endfor %}"})";
  auto t = ChatTemplate::FromModelDirectory(dir.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Apply({{"user", "x"}}, false).value(), "<|im_start|>{'role': 'user', 'content': 'x'}");
  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": "<s>"})";
  EXPECT_EQ(ChatTemplate::FromModelDirectory(dir.string()).status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
  const std::string tiny = KVMESH_TINY_MODEL_DIR;
  if (std::filesystem::exists(tiny + "/tokenizer_config.json")) {
    auto tt = ChatTemplate::FromModelDirectory(tiny);
    ASSERT_TRUE(tt.ok()) << tt.status();
    EXPECT_NE(tt->Apply({{"user", "Hi"}}, true).value().find("Hi"), std::string::npos);
  }
}

}  // namespace
}  // namespace kvmesh::model
