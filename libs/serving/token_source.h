// TokenSource: where a front door (OpenAiService) gets its tokens from — the
// in-process AsyncEngine of `kvmesh serve` (AsyncEngineTokenSource), or a cluster of
// workers behind the scheduler (the router's RemoteTokenSource, services/router).
//
// The contract is AsyncEngine's: Submit validates and queues a request, whose
// on_output then receives every output, exactly one of them final (also on abort and
// failure), on a thread of the source's choosing; Abort ends a request wherever it is
// (unknown ids are ignored).
//
// Thread-safety: implementations are thread-safe.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "engine/async_engine.h"
#include "engine/request.h"
#include "engine/request_validator.h"

namespace kvmesh::serving {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual absl::Status Submit(engine::EngineRequest request) = 0;
  virtual void Abort(const std::string& request_id) = 0;
  // What a request is validated against before Submit.
  virtual const engine::RequestLimits& limits() const = 0;
};

// The in-process engine as a TokenSource. `engine` must outlive this.
class AsyncEngineTokenSource final : public TokenSource {
 public:
  explicit AsyncEngineTokenSource(engine::AsyncEngine& engine) : engine_(engine) {}
  absl::Status Submit(engine::EngineRequest request) override { return engine_.Submit(std::move(request)); }
  void Abort(const std::string& request_id) override { engine_.Abort(request_id); }
  const engine::RequestLimits& limits() const override { return engine_.limits(); }

 private:
  engine::AsyncEngine& engine_;
};

}  // namespace kvmesh::serving
