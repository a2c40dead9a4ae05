#include "worker/outgoing_calls.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "gtest/gtest.h"

namespace kvmesh::worker {
namespace {

TEST(OutgoingCallsTest, CountsCallsUntilTheyEnd) {
  OutgoingCalls calls;
  const auto a = calls.Begin([] {});
  const auto b = calls.Begin([] {});
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(calls.num_open(), 2);
  calls.End(*a);
  calls.End(*a);  // twice: ignored
  EXPECT_EQ(calls.num_open(), 1);
  calls.End(*b);
  EXPECT_EQ(calls.num_open(), 0);
}

// A gRPC call cancelled with TryCancel still completes later, on another thread: the
// wait covers that completion, not only the cancel.
TEST(OutgoingCallsTest, CancelAllAndWaitCancelsEveryCallAndWaitsForItsCompletion) {
  OutgoingCalls calls;
  std::promise<void> cancelled;
  std::atomic<bool> completion_ran{false};
  const auto id = calls.Begin([&cancelled] { cancelled.set_value(); });
  ASSERT_TRUE(id.has_value());
  std::thread completion([&, id = *id] {
    cancelled.get_future().wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    completion_ran = true;
    calls.End(id);
  });
  calls.CancelAllAndWait();
  EXPECT_TRUE(completion_ran);
  EXPECT_EQ(calls.num_open(), 0);
  completion.join();
}

TEST(OutgoingCallsTest, RefusesNewCallsOnceStopping) {
  OutgoingCalls calls;
  calls.CancelAllAndWait();  // nothing open: returns at once
  bool cancel_ran = false;
  EXPECT_FALSE(calls.Begin([&cancel_ran] { cancel_ran = true; }).has_value());
  EXPECT_FALSE(cancel_ran);
  EXPECT_EQ(calls.num_open(), 0);
}

// A cancel function may be the last owner of its call (it captures a shared_ptr): it is
// released once run, and the call object outlives the cancel that races its End.
TEST(OutgoingCallsTest, ReleasesCancelFunctionsOnceRun) {
  auto call = std::make_shared<int>(7);
  std::weak_ptr<int> watch = call;
  OutgoingCalls calls;
  const auto id = calls.Begin([call] { EXPECT_EQ(*call, 7); });
  ASSERT_TRUE(id.has_value());
  call.reset();
  EXPECT_FALSE(watch.expired());  // the registry holds it
  std::thread completion([&calls, id = *id] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    calls.End(id);
  });
  calls.CancelAllAndWait();
  completion.join();
  EXPECT_TRUE(watch.expired());
}

// The destructor waits too: a completion that ends after the owner began destroying the
// registry still finds it alive.
TEST(OutgoingCallsTest, DestructionWaitsForOpenCalls) {
  std::atomic<bool> ended{false};
  std::thread completion;
  {
    OutgoingCalls calls;
    auto fired = std::make_shared<std::promise<void>>();
    const auto id = calls.Begin([fired] { fired->set_value(); });
    ASSERT_TRUE(id.has_value());
    completion = std::thread([&calls, &ended, fired, id = *id] {
      fired->get_future().wait();
      ended = true;
      calls.End(id);
    });
  }
  EXPECT_TRUE(ended);
  completion.join();
}

}  // namespace
}  // namespace kvmesh::worker
