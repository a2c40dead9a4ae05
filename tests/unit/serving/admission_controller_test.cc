#include "serving/admission_controller.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/retry_after.h"

namespace kvmesh::serving {
namespace {

struct FakeClock {
  double now = 1000;
  std::function<double()> Fn() {
    return [this] { return now; };
  }
};

std::unique_ptr<AdmissionController> Make(AdmissionOptions options, FakeClock& clock) {
  options.now_s = clock.Fn();
  return AdmissionController::Create(std::move(options)).value();
}

TEST(AdmissionControllerTest, ShapeLimitsAreInvalidArgumentNamingTheField) {
  FakeClock clock;
  auto a = Make({.max_inflight_sequences = 8, .max_prompts_per_request = 4, .max_prompt_tokens_per_request = 100,
                 .max_stop_strings = 2, .max_stop_string_bytes = 5},
                clock);
  absl::Status s = a->CheckShape({.num_prompts = 5});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "prompt: 5 prompts in one request; at most 4 are accepted");
  const std::vector<std::string> three = {"a", "b", "c"};
  EXPECT_EQ(a->CheckShape({.stop = &three}).message(), "stop: 3 stop strings; at most 2 are accepted");
  const std::vector<std::string> long_one = {"ok", "toolong"};
  EXPECT_EQ(a->CheckShape({.stop = &long_one}).message(),
            "stop[1]: 7 bytes; a stop string may have at most 5");
  // n x prompts beyond what ever fits is a 400, not a 429 to retry forever.
  EXPECT_EQ(a->CheckShape({.num_prompts = 3, .n = 3}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Admit("", {.num_prompts = 1, .prompt_tokens = 101}).status().message(),
            "prompt: 101 prompt tokens in one request; at most 100 are accepted");
  EXPECT_EQ(a->inflight_sequences(), 0);
}

TEST(AdmissionControllerTest, NTimesPromptsCountAgainstTheInflightLimitUntilTheTicketGoes) {
  FakeClock clock;
  auto a = Make({.max_inflight_sequences = 8, .fair_share = false}, clock);
  auto first = a->Admit("", {.num_prompts = 2, .n = 3, .prompt_tokens = 4});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(a->inflight_sequences(), 6);
  auto second = a->Admit("", {.num_prompts = 1, .n = 3, .prompt_tokens = 1});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RetryAfterSeconds(second.status()), 1);
  { AdmissionController::Ticket released = *std::move(first); }
  EXPECT_EQ(a->inflight_sequences(), 0);
  EXPECT_TRUE(a->Admit("", {.num_prompts = 1, .n = 3, .prompt_tokens = 1}).ok());
}

TEST(AdmissionControllerTest, RequestRateIsATokenBucketPerKeyWithRetryAfter) {
  FakeClock clock;
  auto a = Make({.key_requests_per_s = 0.5, .key_request_burst = 2, .fair_share = false}, clock);
  std::vector<AdmissionController::Ticket> held;
  held.push_back(*a->Admit("k1", {.prompt_tokens = 1}));
  held.push_back(*a->Admit("k1", {.prompt_tokens = 1}));
  const absl::Status third = a->Admit("k1", {.prompt_tokens = 1}).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RetryAfterSeconds(third), 2);  // one request at 0.5/s
  EXPECT_TRUE(a->Admit("k2", {.prompt_tokens = 1}).ok());  // another key has its own bucket
  clock.now += 2;
  EXPECT_TRUE(a->Admit("k1", {.prompt_tokens = 1}).ok());
}

TEST(AdmissionControllerTest, TokenRateCountsPromptAndMaxTokensAndAFullBucketAdmitsALargeRequestIntoDebt) {
  FakeClock clock;
  auto a = Make({.key_tokens_per_s = 100, .key_token_burst = 100, .fair_share = false}, clock);
  // 10 prompt tokens + 2 samples x 20 = 50.
  EXPECT_TRUE(a->Admit("k", {.n = 2, .max_tokens = 20, .prompt_tokens = 10}).ok());
  const absl::Status s = a->Admit("k", {.n = 2, .max_tokens = 40, .prompt_tokens = 10}).status();  // 90 > 50 left
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RetryAfterSeconds(s), 1);  // 40 more tokens at 100/s
  clock.now += 10;  // full again
  // Larger than the bucket: admitted when full, then the key waits out the debt.
  EXPECT_TRUE(a->Admit("k", {.max_tokens = 250, .prompt_tokens = 50}).ok());
  const absl::Status after = a->Admit("k", {.max_tokens = 1, .prompt_tokens = 1}).status();
  EXPECT_EQ(after.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RetryAfterSeconds(after), 3);  // from -200 to 2 tokens at 100/s
}

TEST(AdmissionControllerTest, FairShareCapsAKeyOnceASecondKeyIsActive) {
  FakeClock clock;
  auto a = Make({.max_inflight_sequences = 8}, clock);
  std::vector<AdmissionController::Ticket> hog;
  for (int i = 0; i < 6; ++i) hog.push_back(*a->Admit("hog", {.prompt_tokens = 1}));  // alone: beyond half is fine
  auto newcomer = a->Admit("new", {.prompt_tokens = 1});
  ASSERT_TRUE(newcomer.ok()) << newcomer.status();
  // Two keys active: the hog's share is 4, it holds 6.
  const absl::Status s = a->Admit("hog", {.prompt_tokens = 1}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("fair share of 4"), std::string::npos) << s;
  // Slots the hog frees go to the newcomer.
  hog.pop_back();
  hog.pop_back();  // the hog holds 4, its share
  EXPECT_TRUE(a->Admit("new", {.prompt_tokens = 1}).ok());
  EXPECT_EQ(a->Admit("hog", {.prompt_tokens = 1}).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(AdmissionControllerTest, BadOptionsAreInvalidArgument) {
  EXPECT_EQ(AdmissionController::Create({.max_inflight_sequences = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdmissionController::Create({.key_tokens_per_s = -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvmesh::serving
