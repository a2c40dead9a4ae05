// Parity of kvmesh's Jinja interpreter with Python's jinja2 on the 18 real chat
// templates in tests/data/chat_templates/: every rendering in fixtures.jsonl
// (made by tools/make-chat-template-fixtures, jinja2 configured as transformers
// configures it) must come out byte for byte, and every case where jinja2
// raised must fail here too (with raise_exception's message when the template
// raised it itself).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/time/civil_time.h"
#include "model/chat_template.h"
#include "tokenizer_test_util.h"

namespace kvmesh::model {
namespace {

using json = nlohmann::ordered_json;

std::string DataDir() { return std::string(KVMESH_SOURCE_DIR) + "/tests/data/chat_templates"; }

ChatTemplateInputs InputsFrom(const json& in) {
  ChatTemplateInputs inputs;
  inputs.messages = in["messages"];
  inputs.tools = in["tools"];
  inputs.add_generation_prompt = in["add_generation_prompt"].get<bool>();
  inputs.tokens = ChatTemplateTokens{in["bos_token"].get<std::string>(), in["eos_token"].get<std::string>()};
  for (auto it = in.begin(); it != in.end(); ++it) {
    if (it.key() == "messages" || it.key() == "tools" || it.key() == "add_generation_prompt" ||
        it.key() == "bos_token" || it.key() == "eos_token") {
      continue;
    }
    inputs.extra[it.key()] = it.value();
  }
  // The fixtures' strftime_now() date: 2024-07-26 10:30 local time.
  inputs.now = absl::FromCivil(absl::CivilSecond(2024, 7, 26, 10, 30, 0), absl::LocalTimeZone());
  return inputs;
}

TEST(ChatTemplateFixtureTest, RendersLikeJinja2OnAllRealTemplates) {
  std::string text;
  ASSERT_TRUE(testing::ReadFile(DataDir() + "/fixtures.jsonl", &text));
  std::map<std::string, ChatTemplate> templates;
  std::map<std::string, std::pair<int, int>> per_template;  // passed, total
  int passed = 0, total = 0, errors = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const json c = json::parse(line);
    const std::string name = c["template"].get<std::string>();
    if (templates.find(name) == templates.end()) {
      std::string source;
      ASSERT_TRUE(testing::ReadFile(DataDir() + "/" + name, &source)) << name;
      absl::StatusOr<ChatTemplate> t = ChatTemplate::FromJinja(source);
      ASSERT_TRUE(t.ok()) << name << ": " << t.status();
      templates.emplace(name, *t);
    }
    ++total;
    ++per_template[name].second;
    absl::StatusOr<std::string> got = templates.at(name).Render(InputsFrom(c["inputs"]));
    bool ok = false;
    if (c.contains("error")) {
      ++errors;
      const std::string want = c["error"].get<std::string>();
      ok = !got.ok() && got.status().code() == absl::StatusCode::kInvalidArgument &&
           (!c["raised"].get<bool>() || absl::StrContains(got.status().message(), want));
      EXPECT_TRUE(ok) << name << ": jinja2 raised \"" << want << "\", kvmesh gave "
                      << (got.ok() ? "\"" + *got + "\"" : got.status().ToString()) << "\n" << line;
    } else {
      ok = got.ok() && *got == c["expected"].get<std::string>();
      EXPECT_TRUE(ok) << name << ": " << (got.ok() ? "" : got.status().ToString()) << "\nwant: "
                      << c["expected"].get<std::string>() << "\ngot:  " << (got.ok() ? *got : "") << "\n" << line;
    }
    if (ok) {
      ++passed;
      ++per_template[name].first;
    }
  }
  for (const auto& [name, counts] : per_template) {
    std::printf("  %-55s %d/%d\n", name.c_str(), counts.first, counts.second);
  }
  std::printf("chat template parity: %d/%d cases over %zu templates (%d expected errors), none skipped\n", passed,
              total, per_template.size(), errors);
  EXPECT_EQ(per_template.size(), 18u);
  EXPECT_GE(total, 500);
  EXPECT_EQ(passed, total);
}

}  // namespace
}  // namespace kvmesh::model
