#include "kv/transport/ucx/writer_fence.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace kvmesh::kv {
namespace {

// A child process that waits to be killed.
pid_t StartSleeper() {
  const pid_t pid = fork();
  if (pid == 0) {
    pause();
    _exit(0);
  }
  return pid;
}

TEST(WriterProcessTest, IsGoneOnlyOnceItsProcessExitedReapedOrNot) {
  const pid_t pid = StartSleeper();
  ASSERT_GT(pid, 0);
  WriterProcess writer = WriterProcess::Open(pid);
  EXPECT_FALSE(writer.Gone());
  kill(pid, SIGSTOP);  // stopped is not gone: it writes again when resumed
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(writer.Gone());
  kill(pid, SIGKILL);
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = writer.Gone();  // a zombie is gone: nothing can write from it
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(gone);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  EXPECT_TRUE(writer.Gone());
  WriterProcess moved = std::move(writer);
  EXPECT_TRUE(moved.Gone());
  EXPECT_FALSE(WriterProcess::Open(0).Gone());  // unknown: never seen gone
}

TEST(WriterFencesTest, AFenceIsReleasedOnceByItsOwnWritersWordOrDeath) {
  WriterFences fences;
  int released = 0;
  fences.Add(/*lease_token=*/7, /*push_id=*/1, WriterProcess::Open(0), [&] { ++released; });
  EXPECT_FALSE(fences.Acknowledge(7, 2).has_value());  // another push's word
  EXPECT_FALSE(fences.Acknowledge(8, 1).has_value());  // another lease's
  EXPECT_TRUE(fences.ReleaseGone().empty());           // an unknown pid is never gone
  std::optional<std::function<void()>> fn = fences.Acknowledge(7, 1);
  ASSERT_TRUE(fn.has_value());
  (*fn)();
  EXPECT_EQ(released, 1);
  EXPECT_FALSE(fences.Acknowledge(7, 1).has_value());  // released once
  EXPECT_EQ(fences.size(), 0);

  const pid_t pid = StartSleeper();
  ASSERT_GT(pid, 0);
  fences.Add(9, 3, WriterProcess::Open(pid), [&] { ++released; });
  EXPECT_TRUE(fences.ReleaseGone().empty());
  kill(pid, SIGKILL);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  std::vector<std::function<void()>> gone = fences.ReleaseGone();
  ASSERT_EQ(gone.size(), 1u);
  gone[0]();
  EXPECT_EQ(released, 2);
  EXPECT_EQ(fences.size(), 0);
}

}  // namespace
}  // namespace kvmesh::kv
