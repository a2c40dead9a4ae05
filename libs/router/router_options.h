// Options of the router (services/router): from the kvmesh-router binary's flags, or
// from `kvmesh router`'s (services/kvmesh/router_command.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "serving/admission_controller.h"

namespace kvmesh::router {

struct RouterOptions {
  std::string model_dir;          // config.json + tokenizer (no weights are loaded)
  std::string served_model_name;  // "": the model directory's name
  std::string chat_template;      // a Jinja file overriding the model's own; "": the model's
  std::string scheduler_address;  // host:port of kvmesh.v1.Scheduler
  std::string host = "127.0.0.1";
  int32_t port = 8000;        // REST; 0: an ephemeral port
  int32_t grpc_port = -1;     // kvmesh.v1.Inference; 0: an ephemeral port, -1: off
  std::vector<std::string> api_keys;
  int32_t max_model_len = 0;  // 0: the model's max_position_embeddings
  // Requests in flight per front door before 429 / RESOURCE_EXHAUSTED. NOTE: a
  // static bound on purpose, not the sum of the workers' registered max_num_seqs:
  // it protects the router itself (open streams, buffers), and max_num_seqs is a
  // batch size, not a request limit — a worker queues beyond it (preempting under KV
  // pressure), and placement already steers away from workers whose heartbeats
  // report long queues or full KV caches.
  // Sequences in flight (n x prompts of each request) over both front doors.
  int32_t max_inflight_requests = 256;
  // Limits per request, per-key rate limits and fair share, over both front doors
  // (max_inflight_sequences is set from max_inflight_requests).
  serving::AdmissionOptions admission;
  int32_t http_threads = 2;
  int32_t max_num_seqs = 256;  // the largest n a request may ask for
  int64_t generate_timeout_ms = 600'000;
  int32_t max_attempts = 3;    // placements per request (an unreachable decode worker costs one)
  // Refresh of the worker view the router places from while the scheduler is
  // unreachable (FallbackPlacer); 0: no fallback.
  int64_t placement_view_refresh_ms = 1'000;
};

}  // namespace kvmesh::router
