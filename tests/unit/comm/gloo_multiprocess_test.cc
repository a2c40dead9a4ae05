// Ranks in separate processes: the parent serves the TCP store and is rank 0; a child
// process (this test binary, re-run with a filter that selects the child body) is rank
// 1. Shows the rendezvous works across processes, and that a peer process killed with
// SIGKILL turns the survivor's next collective into an error, not a hang.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo_communicator.h"
#include "comm/tcp_store_client.h"
#include "comm/tcp_store_server.h"
#include "gtest/gtest.h"

extern char** environ;

namespace kvmesh::comm {
namespace {

constexpr char kStoreEnv[] = "KVMESH_COMM_TEST_STORE";
constexpr char kModeEnv[] = "KVMESH_COMM_TEST_CHILD_MODE";

// The child's body: rank 1 of 2. Skipped unless the parent started this process.
TEST(GlooChildProcess, Rank1) {
  const char* address = std::getenv(kStoreEnv);
  const char* mode = std::getenv(kModeEnv);
  if (address == nullptr || mode == nullptr) GTEST_SKIP() << "runs only as the child of a multi-process test";
  auto store = TcpStoreClient::Connect(address, absl::Seconds(20)).value();
  auto comm = GlooCommunicator::Create({.rank = 1, .world_size = 2, .timeout = absl::Seconds(20)}, *store).value();
  std::vector<float> data(256, 2.0f);
  ASSERT_TRUE(comm->AllReduceSum(data.data(), data.size(), DType::kF32).ok());
  ASSERT_EQ(data[255], 3.0f);
  // "wait": stay in the group until the parent kills this process.
  if (std::string(mode) == "wait") std::this_thread::sleep_for(std::chrono::seconds(60));
}

// Starts this binary as rank 1 in `mode`; returns its pid.
pid_t SpawnChild(const std::string& address, const std::string& mode) {
  const std::string filter = "--gtest_filter=GlooChildProcess.Rank1";
  std::vector<std::string> env_strings = {std::string(kStoreEnv) + "=" + address, std::string(kModeEnv) + "=" + mode};
  std::vector<char*> env;
  for (std::string& s : env_strings) env.push_back(s.data());
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(nullptr);
  char self[] = "/proc/self/exe";
  std::vector<char*> argv = {self, const_cast<char*>(filter.c_str()), nullptr};
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), env.data()), 0);
  return pid;
}

// waitpid with a deadline: -1 if the child is still running at the deadline.
int WaitExit(pid_t pid, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

TEST(GlooMultiProcessTest, RanksInTwoProcessesMeetThroughTheTcpStore) {
  auto server = TcpStoreServer::Start({}).value();
  const pid_t child = SpawnChild(server->address(), "exit");
  ASSERT_GT(child, 0);
  auto store = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
  auto comm = GlooCommunicator::Create({.rank = 0, .world_size = 2, .timeout = absl::Seconds(20)}, *store);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> data(256, 1.0f);
  EXPECT_TRUE((*comm)->AllReduceSum(data.data(), data.size(), DType::kF32).ok());
  EXPECT_EQ(data[0], 3.0f);
  const int status = WaitExit(child, absl::Seconds(20));
  ASSERT_TRUE(WIFEXITED(status)) << "child status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(GlooMultiProcessTest, PeerProcessKilledMidGroupGivesAnErrorNotAHang) {
  auto server = TcpStoreServer::Start({}).value();
  const pid_t child = SpawnChild(server->address(), "wait");
  ASSERT_GT(child, 0);
  auto store = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
  auto comm = GlooCommunicator::Create({.rank = 0, .world_size = 2, .timeout = absl::Seconds(30)}, *store);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> data(256, 1.0f);
  ASSERT_TRUE((*comm)->AllReduceSum(data.data(), data.size(), DType::kF32).ok());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  const absl::Time start = absl::Now();
  const absl::Status status = (*comm)->AllReduceSum(data.data(), data.size(), DType::kF32);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  // The kernel closes a killed process's sockets: no need to wait out the 30 s timeout.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Writes to the dead peer must not kill this process with SIGPIPE.
  struct sigaction current {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &current), 0);
  EXPECT_EQ(current.sa_handler, SIG_IGN);
}

}  // namespace
}  // namespace kvmesh::comm
