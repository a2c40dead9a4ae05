// ChildProcess: a kvmesh service binary run as a child of an integration test. Its
// stderr (the log) is collected on a thread; Start() waits for the log line that says it
// serves and reads the port that line gives (" port=N"). Stop() is a graceful SIGTERM,
// Signal() sends anything else (SIGSTOP, SIGCONT, SIGKILL). The child dies with the test
// (PR_SET_PDEATHSIG): a test killed mid-run leaves no service behind.
//
// Thread-safety: log() and port() from any thread; the rest from the test's thread.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace kvmesh::testing {

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { Stop(); }

  // Runs argv (argv[0]: the binary) and waits up to 20 s for a log line containing
  // `ready_marker` with " port=N". Fails the test (ASSERT) otherwise.
  void Start(const std::vector<std::string>& argv, const std::string& ready_marker) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      port_ = 0;
      eof_ = false;
    }
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    reader_ = std::thread([this, fd = fds[0], ready_marker] {
      FILE* in = fdopen(fd, "r");
      char line[4096];
      while (fgets(line, sizeof(line), in) != nullptr) {
        std::lock_guard<std::mutex> lock(mu_);
        log_ += line;
        const std::string s(line);
        if (port_ == 0 && s.find(ready_marker) != std::string::npos) {
          const size_t at = s.find(" port=");
          if (at != std::string::npos) port_ = std::atoi(s.c_str() + at + 6);
          cv_.notify_all();
        }
      }
      fclose(in);
      std::lock_guard<std::mutex> lock(mu_);
      eof_ = true;
      cv_.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(20), [&] { return port_ != 0 || eof_; });
    ASSERT_NE(port_, 0) << argv[0] << " did not report its port; log:\n" << log_;
  }

  // SIGTERM, then the exit status (-1 if it had to be killed, or was not running).
  int Stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGCONT);  // a stopped child cannot act on SIGTERM
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        Reap();
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    Reap();
    return -1;
  }

  // Sends `signal`; for SIGKILL also waits for the child to be gone, for SIGSTOP for it
  // to have stopped (the signal is asynchronous: a thread of the child may otherwise
  // still answer a call made right after).
  void Signal(int signal) {
    if (pid_ <= 0) return;
    kill(pid_, signal);
    int status = 0;
    if (signal == SIGKILL) {
      waitpid(pid_, &status, 0);
      Reap();
    } else if (signal == SIGSTOP) {
      waitpid(pid_, &status, WUNTRACED);
    }
  }

  bool running() const { return pid_ > 0; }
  int port() {
    std::lock_guard<std::mutex> lock(mu_);
    return port_;
  }
  std::string address() { return absl::StrCat("127.0.0.1:", port()); }
  std::string log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }

 private:
  void Reap() {
    pid_ = 0;
    if (reader_.joinable()) reader_.join();
  }

  pid_t pid_ = 0;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string log_;
  int port_ = 0;
  bool eof_ = false;
};

}  // namespace kvmesh::testing
