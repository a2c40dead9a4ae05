#include "worker/unreachable_reporter.h"

#include <utility>

#include <grpcpp/grpcpp.h>

#include "core/logging.h"
#include "rpc/channel.h"

namespace kvmesh::worker {

UnreachableReporter::UnreachableReporter(UnreachableReporterOptions options)
    : options_(std::move(options)), stub_(v1::Scheduler::NewStub(rpc::CreateChannel(options_.scheduler_address))) {}

UnreachableReporter::~UnreachableReporter() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return in_flight_ == 0; });
}

void UnreachableReporter::Report(const std::string& address, const std::string& reason) {
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, fresh] = last_report_.try_emplace(address, now);
    if (!fresh) {
      if (now - it->second < std::chrono::milliseconds(options_.min_interval_ms)) return;
      it->second = now;
    }
    ++in_flight_;
  }
  struct Pending {
    grpc::ClientContext context;
    v1::ReportUnreachableRequest request;
    v1::ReportUnreachableResponse response;
  };
  // Counted down when the call's state is destroyed (with the callback that holds it),
  // not in the callback: the context must not outlive this (gRPC aborts at exit).
  std::shared_ptr<Pending> pending(new Pending, [this](Pending* p) {
    delete p;
    std::lock_guard<std::mutex> lock(mu_);
    if (--in_flight_ == 0) idle_.notify_all();
  });
  pending->request.set_address(address);
  pending->request.set_reporter(options_.reporter);
  pending->request.set_reason(reason);
  rpc::SetTimeout(&pending->context, options_.timeout_ms);
  KVMESH_LOG(kWarning) << "reporting an unreachable peer to the scheduler" << LogKv("peer", address)
                       << LogKv("reason", reason);
  grpc::ClientContext* context = &pending->context;
  v1::ReportUnreachableRequest* request = &pending->request;
  v1::ReportUnreachableResponse* response = &pending->response;
  stub_->async()->ReportUnreachable(context, request, response,
                                    [pending = std::move(pending), address](grpc::Status status) {
                                      if (!status.ok()) {
                                        KVMESH_LOG(kWarning) << "unreachable report failed" << LogKv("peer", address)
                                                             << LogKv("status", status.error_message());
                                      }
                                    });
}

}  // namespace kvmesh::worker
