#include "serving/text_generation_stream.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kvmesh::serving {
namespace {

class TextGenerationStreamTest : public testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = model::Tokenizer::FromDirectory(KVMESH_TINY_MODEL_DIR);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(tokenizer).value();
  }

  // One engine output per token of `text`, for sample `index`; the last one finishes
  // with `finish` when given.
  std::vector<engine::RequestOutput> Outputs(const std::string& text, int32_t index = 0,
                                             engine::CompletionFinishReason finish = engine::CompletionFinishReason::kNone) {
    const std::vector<int32_t> ids = tokenizer_->Encode(text, /*add_special_tokens=*/false);
    std::vector<engine::RequestOutput> outs;
    for (size_t i = 0; i < ids.size(); ++i) {
      engine::RequestOutput out;
      out.request_id = "r";
      out.num_prompt_tokens = 7;
      engine::CompletionOutput c;
      c.index = index;
      c.new_token_ids = {ids[i]};
      if (i + 1 == ids.size()) c.finish_reason = finish;
      out.outputs.push_back(c);
      out.finished = i + 1 == ids.size() && finish != engine::CompletionFinishReason::kNone;
      outs.push_back(out);
    }
    return outs;
  }

  // Feeds outputs until the stream says stop; returns the concatenated text.
  std::string Run(TextGenerationStream& stream, const std::vector<engine::RequestOutput>& outs,
                  std::optional<std::string>* finish) {
    std::string text;
    for (const auto& out : outs) {
      for (const SampleDelta& d : stream.Consume(out)) {
        text += d.text;
        if (d.finish_reason) *finish = d.finish_reason;
      }
      if (stream.all_finished()) break;
    }
    return text;
  }

  std::unique_ptr<model::Tokenizer> tokenizer_;
};

TEST_F(TextGenerationStreamTest, WithoutStopStringsTheTextIsTheDecodedTokens) {
  TextGenerationStream stream(*tokenizer_, {});
  std::optional<std::string> finish;
  const std::string text = "Hello world, 键值缓存 🚀 done.";
  EXPECT_EQ(Run(stream, Outputs(text, 0, engine::CompletionFinishReason::kLength), &finish), text);
  EXPECT_EQ(finish, "length");
  EXPECT_TRUE(stream.all_finished());
  EXPECT_FALSE(stream.needs_abort());
  EXPECT_EQ(stream.num_prompt_tokens(), 7);
}

TEST_F(TextGenerationStreamTest, StopStringEndsTheSampleAndIsNotEmitted) {
  TextGenerationStream stream(*tokenizer_, {.stop = {"STOP"}});
  std::optional<std::string> finish;
  EXPECT_EQ(Run(stream, Outputs("one two STOP three four"), &finish), "one two ");
  EXPECT_EQ(finish, "stop");
  EXPECT_TRUE(stream.needs_abort());  // the engine would keep going without an abort
  EXPECT_EQ(stream.text(0), "one two ");
}

TEST_F(TextGenerationStreamTest, IncludeStopStringKeepsIt) {
  TextGenerationStream stream(*tokenizer_, {.stop = {"\n\n"}, .include_stop_str_in_output = true});
  std::optional<std::string> finish;
  EXPECT_EQ(Run(stream, Outputs("line one\n\nline two"), &finish), "line one\n\n");
}

TEST_F(TextGenerationStreamTest, PossibleStopPrefixIsHeldBackUntilResolved) {
  TextGenerationStream stream(*tokenizer_, {.stop = {"xyzzy"}});
  const auto outs = Outputs("abc xyz more xyzzy tail");
  std::string text;
  bool held = false;
  for (const auto& out : outs) {
    for (const SampleDelta& d : stream.Consume(out)) {
      text += d.text;
      if (text == "abc " || text.find("xyz") == std::string::npos) held = held || text == "abc ";
    }
    // Never emits a suffix that is a prefix of the stop string while it is pending.
    EXPECT_EQ(text.find("xyzzy"), std::string::npos);
  }
  EXPECT_EQ(text, "abc xyz more ");
  EXPECT_TRUE(held);
}

TEST_F(TextGenerationStreamTest, EarliestOfSeveralStopStringsWins) {
  TextGenerationStream stream(*tokenizer_, {.stop = {"world", "lo"}});
  std::optional<std::string> finish;
  EXPECT_EQ(Run(stream, Outputs("hello world"), &finish), "hel");
}

TEST_F(TextGenerationStreamTest, HeldTextIsFlushedWhenTheEngineFinishes) {
  TextGenerationStream stream(*tokenizer_, {.stop = {"abcdef"}});
  std::optional<std::string> finish;
  EXPECT_EQ(Run(stream, Outputs("end abc", 0, engine::CompletionFinishReason::kLength), &finish), "end abc");
  EXPECT_EQ(finish, "length");
}

TEST_F(TextGenerationStreamTest, AbortedRequestFinishesEverySampleOnce) {
  TextGenerationStream stream(*tokenizer_, {.n = 2});
  engine::RequestOutput out;
  out.request_id = "r";
  out.finished = true;
  const auto deltas = stream.Consume(out);
  ASSERT_EQ(deltas.size(), 2u);
  EXPECT_EQ(deltas[0].finish_reason, "abort");
  EXPECT_EQ(deltas[1].finish_reason, "abort");
  EXPECT_TRUE(stream.all_finished());
}

TEST_F(TextGenerationStreamTest, FailedRequestFinishesWithError) {
  TextGenerationStream stream(*tokenizer_, {});
  engine::RequestOutput out;
  out.finished = true;
  out.status = absl::InternalError("runner failed");
  const auto deltas = stream.Consume(out);
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].finish_reason, "error");
}

TEST_F(TextGenerationStreamTest, SamplesAreIndependent) {
  TextGenerationStream stream(*tokenizer_, {.n = 2, .stop = {"STOP"}});
  std::optional<std::string> finish;
  Run(stream, Outputs("a STOP b", 0), &finish);
  EXPECT_FALSE(stream.all_finished());
  auto second = Outputs("c d", 1, engine::CompletionFinishReason::kLength);
  second.back().finished = false;  // sample 0 is still running in the engine
  Run(stream, second, &finish);
  EXPECT_TRUE(stream.all_finished());
  EXPECT_EQ(stream.text(0), "a ");
  EXPECT_EQ(stream.text(1), "c d");
  EXPECT_TRUE(stream.needs_abort());
}

}  // namespace
}  // namespace kvmesh::serving

namespace kvmesh::serving {
namespace {

TEST_F(TextGenerationStreamTest, TheMatchedStopStringIsReported) {
  TextGenerationStream stream(*tokenizer_, {.stop = {"zzz", "two"}});
  std::optional<std::string> stop_string;
  for (const auto& out : Outputs("one two three")) {
    for (const SampleDelta& d : stream.Consume(out)) {
      if (d.stop_string) stop_string = d.stop_string;
    }
  }
  EXPECT_EQ(stop_string, "two");
}

}  // namespace
}  // namespace kvmesh::serving
