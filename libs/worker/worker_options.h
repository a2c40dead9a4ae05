// What a worker process of the disaggregated cluster is started with (worker.h): its
// options, from the kvmesh-prefill-worker / kvmesh-decode-worker / `kvmesh worker`
// flags (libs/cli/worker_flags.h), and the model it serves, loaded and built by the
// caller.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "engine/engine.h"
#include "engine/llama_model.h"
#include "engine/model_runner.h"
#include "kvmesh/v1/scheduler.pb.h"
#include "worker/worker_state.h"

namespace kvmesh::worker {

// How prefill -> decode KV moves.
enum class KvTransportChoice {
  kAuto,  // UCX when this worker can start it and the peer has it too; else gRPC
  kUcx,   // one-sided UCX puts; the worker fails to start without UCX
  kGrpc,  // the PushKvBlocks byte stream
};

struct WorkerOptions {
  v1::WorkerRole role = v1::WORKER_ROLE_BOTH;
  std::string listen = "127.0.0.1:0";  // port 0 picks a free one
  std::string advertise_address;       // "": the bound listen address
  std::string scheduler;               // "": run unregistered
  std::string worker_id;               // "": worker-<advertised address>
  std::string model_name;              // the model name registered with the scheduler
  int32_t metrics_port = -1;           // /metrics, /health, /live; 0: a free one; -1: off
  std::string metrics_host = "127.0.0.1";
  bool stream_kv_layers = true;        // prefill side: push each layer's KV once computed
  int64_t kv_lease_timeout_ms = 30'000;
  KvTransportChoice kv_transport = KvTransportChoice::kAuto;
  std::string ucx_tls;                 // UCX_TLS syntax; "": the environment's, else UCX's choice
  int64_t kv_progress_timeout_ms = 1'000;
  WorkerState::RemotePrefillPolicy remote_prefill;
  int64_t drain_timeout_ms = 30'000;   // on Drain: how long running requests may take
};

// The model a worker serves. Members are destroyed bottom-up: the runner before the
// model it runs, the model before the backend it lives on.
struct WorkerModel {
  std::unique_ptr<backend::Backend> backend;   // may be null with `model`
  std::unique_ptr<engine::LlamaModel> model;  // may be null for a runner that needs none
  std::unique_ptr<engine::ModelRunner> runner;  // required
  engine::EngineOptions engine;  // record_events and the lease timeouts are the worker's
  int32_t num_kv_heads = 0;
  std::vector<int32_t> eos_token_ids;
};

}  // namespace kvmesh::worker
