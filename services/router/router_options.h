// Options of the router (services/router): from the kvmesh-router binary's flags, or
// from `kvmesh router`'s (services/kvmesh/router_command.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvmesh::router {

struct RouterOptions {
  std::string model_dir;          // config.json + tokenizer (no weights are loaded)
  std::string served_model_name;  // "": the model directory's name
  std::string scheduler_address;  // host:port of kvmesh.v1.Scheduler
  std::string host = "127.0.0.1";
  int32_t port = 8000;        // REST; 0: an ephemeral port
  int32_t grpc_port = -1;     // kvmesh.v1.Inference; 0: an ephemeral port, -1: off
  std::vector<std::string> api_keys;
  int32_t max_model_len = 0;  // 0: the model's max_position_embeddings
  // Requests in flight per front door before 429 / RESOURCE_EXHAUSTED. NOTE: a
  // static bound on purpose, not one derived from the workers' registered capacity:
  // it protects the router itself (open streams, buffers), while the workers queue
  // what exceeds their max_num_seqs and refuse (RESOURCE_EXHAUSTED -> 429) what their
  // KV cache cannot hold, which they know better than a heartbeat-old sum would.
  int32_t max_inflight_requests = 256;
  int32_t http_threads = 2;
  int32_t max_num_seqs = 256;  // the largest n a request may ask for
  int64_t generate_timeout_ms = 600'000;
  int32_t max_attempts = 3;    // placements per request (an unreachable decode worker costs one)
};

}  // namespace kvmesh::router
