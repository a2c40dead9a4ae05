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

TEST(ChatTemplateTest, RecognisesRealJinjaTemplates) {
  std::string text;
  ASSERT_TRUE(testing::ReadFile(testing::FixtureDir() + "/chat_templates.jinja.json", &text));
  const json templates = json::parse(text);
  EXPECT_EQ(ChatTemplate::FromJinja(templates["llama3"]).value().kind(), ChatTemplateKind::kLlama3);
  EXPECT_EQ(ChatTemplate::FromJinja(templates["chatml"]).value().kind(), ChatTemplateKind::kChatMl);
  EXPECT_EQ(ChatTemplate::FromJinja(templates["mistral"]).value().kind(), ChatTemplateKind::kMistral);
  EXPECT_EQ(ChatTemplate::FromJinja("{{ messages }}").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, FromNameRejectsUnknown) {
  EXPECT_TRUE(ChatTemplate::FromName("chatml").ok());
  EXPECT_EQ(ChatTemplate::FromName("vicuna").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, RejectsEmptyAndUnknownRoles) {
  auto t = ChatTemplate::FromName("llama3").value();
  EXPECT_EQ(t.Apply({}, true, "<|begin_of_text|>").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Apply({{"wizard", "hi"}}, true, "").status().code(), absl::StatusCode::kInvalidArgument);
  auto m = ChatTemplate::FromName("mistral").value();
  EXPECT_EQ(m.Apply({{"user", "a"}, {"user", "b"}}, false, "<s>").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Apply({{"user", "a"}, {"assistant", "b"}}, false, "<s>").value(), "<s>[INST] a [/INST]b</s>");
}

TEST(ChatTemplateTest, FromModelDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / ("kvmesh_chat_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "{% for m in messages %}<|im_start|>{{ m }}{% endfor %}"})";
  auto t = ChatTemplate::FromModelDirectory(dir.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->kind(), ChatTemplateKind::kChatMl);
  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": "<s>"})";
  EXPECT_EQ(ChatTemplate::FromModelDirectory(dir.string()).status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
  const std::string tiny = KVMESH_TINY_MODEL_DIR;
  if (std::filesystem::exists(tiny + "/tokenizer_config.json")) {
    auto tt = ChatTemplate::FromModelDirectory(tiny);
    EXPECT_TRUE(tt.ok()) << tt.status();
  }
}

}  // namespace
}  // namespace kvmesh::model
