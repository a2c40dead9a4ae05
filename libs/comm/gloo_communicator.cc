#include "comm/gloo_communicator.h"

#include <signal.h>

#include <cstring>
#include <exception>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"

namespace kvmesh::comm {
namespace {

// gloo::rendezvous::Store over a kvmesh Store: Gloo expects exceptions on failure.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(comm::Store& store, std::chrono::milliseconds timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status status = store_.Set(key, std::string(data.begin(), data.end()));
    if (!status.ok()) throw gloo::IoException(std::string(status.message()));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = store_.Get(key, absl::FromChrono(timeout_));
    if (!value.ok()) throw gloo::IoException(std::string(value.status().message()));
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
    for (const std::string& key : keys) {
      absl::StatusOr<std::string> value = store_.Get(key, std::max(deadline - absl::Now(), absl::ZeroDuration()));
      if (!value.ok()) throw gloo::IoException(std::string(value.status().message()));
    }
  }

 private:
  comm::Store& store_;
  const std::chrono::milliseconds timeout_;
};

// NOTE: Gloo's TCP pairs write with writev(), which raises SIGPIPE on a socket whose
// peer is gone, and SIGPIPE's default action ends the process: a lost peer would kill
// the worker instead of failing the collective with an error. Ignore it (the write then
// fails with EPIPE, which Gloo reports) unless the process already handles it.
void IgnoreSigpipeOnce() {
  static const bool done = [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
    return true;
  }();
  (void)done;
}

// Gloo's messages say "Timed out" for a peer that does not answer in time.
absl::Status FromGlooError(const char* what, const std::exception& e) {
  const std::string message = absl::StrCat("gloo ", what, ": ", e.what());
  const std::string lower = absl::AsciiStrToLower(e.what());
  if (absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout"))
    return absl::DeadlineExceededError(message);
  return absl::UnavailableError(message);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(const GlooCommunicatorOptions& options,
                                                                            Store& store) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    return absl::InvalidArgumentError(
        absl::StrCat("communicator rank ", options.rank, " is not in a group of ", options.world_size));
  if (options.timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("communicator timeout must be > 0");
  const auto timeout = absl::ToChronoMilliseconds(options.timeout);
  IgnoreSigpipeOnce();
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    context->setTimeout(timeout);
    GlooStoreAdapter adapter(store, timeout);
    gloo::rendezvous::PrefixStore prefixed(options.group_name, adapter);
    context->connectFullMesh(prefixed, device);
    return std::unique_ptr<GlooCommunicator>(
        new GlooCommunicator(options.rank, options.world_size, timeout, std::move(context)));
  } catch (const std::exception& e) {
    return FromGlooError("rendezvous", e);
  }
}

GlooCommunicator::~GlooCommunicator() = default;

template <typename Fn>
absl::Status GlooCommunicator::Run(const char* what, Fn&& fn) {
  if (!broken_.ok())
    return absl::FailedPreconditionError(absl::StrCat("communicator group is broken: ", broken_.message()));
  if (world_size_ == 1) return absl::OkStatus();
  try {
    fn(next_tag_++);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    broken_ = FromGlooError(what, e);
    return broken_;
  }
}

absl::Status GlooCommunicator::AllReduceSum(void* data, int64_t count, DType dtype) {
  if (dtype != DType::kF32)
    return absl::InvalidArgumentError(absl::StrCat("gloo all-reduce supports f32, not ", ToAbsl(DTypeName(dtype))));
  if (count == 0) return absl::OkStatus();
  return Run("all-reduce", [&](uint32_t tag) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(static_cast<float*>(data), static_cast<size_t>(count));
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  });
}

absl::Status GlooCommunicator::AllGather(const void* send, void* recv, int64_t count, DType dtype) {
  if (count == 0) return absl::OkStatus();
  const size_t bytes = static_cast<size_t>(count * DTypeSize(dtype));
  char* out = static_cast<char*>(recv);
  if (world_size_ == 1) {
    if (send != recv) std::memmove(out, send, bytes);
    return absl::OkStatus();
  }
  return Run("all-gather", [&](uint32_t tag) {
    gloo::AllgatherOptions opts(context_);
    // Without an input Gloo works in place: this rank's slot of the output is its input.
    if (send != out + rank_ * bytes) opts.setInput(const_cast<char*>(static_cast<const char*>(send)), bytes);
    opts.setOutput(out, bytes * world_size_);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::allgather(opts);
  });
}

absl::Status GlooCommunicator::Broadcast(void* data, int64_t count, DType dtype, int root) {
  if (root < 0 || root >= world_size_)
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not in a group of ", world_size_));
  if (count == 0) return absl::OkStatus();
  return Run("broadcast", [&](uint32_t tag) {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<char*>(data), static_cast<size_t>(count * DTypeSize(dtype)));
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  });
}

absl::Status GlooCommunicator::Barrier() {
  return Run("barrier", [&](uint32_t tag) {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  });
}

}  // namespace kvmesh::comm
