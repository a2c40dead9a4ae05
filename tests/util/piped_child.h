// A child process whose stdin and stdout are pipes to this one: how a test or benchmark
// drives a peer process (a KV receiver or sender it can stop, resume or kill).
//
// Thread-safety: plain functions.
#pragma once

#include <spawn.h>
#include <unistd.h>

#include <string>
#include <vector>

extern char** environ;

namespace kvmesh::testing {

struct PipedChild {
  pid_t pid = -1;  // -1 when it could not be started
  int to = -1;     // its stdin
  int from = -1;   // its stdout
};

// Starts `argv` (argv[0] searched in PATH) with this process's environment plus
// `env_extra` ("NAME=value" each, taking precedence).
inline PipedChild SpawnPiped(std::vector<std::string> argv, const std::vector<std::string>& env_extra = {}) {
  int in[2], out[2];
  if (pipe(in) != 0) return {};
  if (pipe(out) != 0) {
    close(in[0]);
    close(in[1]);
    return {};
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, in[1]);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<std::string> env = env_extra;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  PipedChild c;
  if (posix_spawnp(&c.pid, args[0], &fa, nullptr, args.data(), envp.data()) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  c.to = in[1];
  c.from = out[0];
  return c;
}

}  // namespace kvmesh::testing
