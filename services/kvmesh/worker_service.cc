#include "worker_service.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "rpc/status_conversion.h"

namespace kvmesh::cli {
namespace {

// KV layouts must match field for field (the proto has no == operator).
bool SameSpec(const v1::KvCacheSpec& a, const v1::KvCacheSpec& b) {
  return a.block_size_tokens() == b.block_size_tokens() && a.num_layers() == b.num_layers() &&
         a.num_kv_heads() == b.num_kv_heads() && a.head_dim() == b.head_dim() && a.dtype() == b.dtype() &&
         a.tp_size() == b.tp_size() && a.block_hash_salt() == b.block_hash_salt();
}

// Chunks of at most this many payload bytes on PushKvBlocks.
constexpr size_t kMaxChunkBytes = 4 << 20;


// ---------------------------------------------------------------------------------------
// Generate: a server-write reactor fed by the engine thread. Deleted when both gRPC
// (OnDone) and the engine (final output, or a failed submit) are done with it.
class GenerateReactor : public grpc::ServerWriteReactor<v1::WorkerGenerateResponse> {
 public:
  GenerateReactor(WorkerState& state, grpc::CallbackServerContext* context, const v1::WorkerGenerateRequest* request)
      : state_(state), request_id_(request->request_id()) {
    (void)context;
    Start(*request);
  }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) queue_.clear();  // the stream is broken; OnCancel aborts the request
    }
    Pump();
  }
  void OnCancel() override { state_.engine().Abort(request_id_); }
  void OnDone() override { Unref(); }

 private:
  void Start(const v1::WorkerGenerateRequest& request) {
    auto engine_request = state_.ToEngineRequest(request.request_id(), request.prompt_token_ids(),
                                                 request.sampling(), request.eos_token_ids());
    if (!engine_request.ok()) return FailSubmit(engine_request.status());
    engine_request->priority = request.priority();
    engine_request->arrival_order = request.arrival_order() > 0 ? request.arrival_order() : -1;
    engine_request->on_output = [this](const engine::RequestOutput& out) { OnOutput(out); };
    const std::string& prefill = request.prefill_worker_address();
    absl::Status s;
    if (prefill.empty() || request.prefill_locally() || prefill == state_.address()) {
      s = state_.engine().Submit(*std::move(engine_request));
    } else {
      auto sampling = std::make_shared<v1::SamplingParams>(request.sampling());
      auto prompt = std::make_shared<std::vector<int32_t>>(request.prompt_token_ids().begin(),
                                                           request.prompt_token_ids().end());
      s = state_.engine().SubmitWith(
          *std::move(engine_request),
          [this, prefill, sampling, prompt](engine::Engine& e, engine::EngineRequest r) -> absl::Status {
            auto lease = e.ReserveForRemotePrefill(std::move(r));
            if (!lease.ok()) return lease.status();
            StartRemotePrefill(*lease, prefill, *sampling, *prompt);
            return absl::OkStatus();
          });
    }
    if (!s.ok()) return FailSubmit(s);
    state_.AddLive(request_id_);
  }

  void FailSubmit(const absl::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finish_status_ = status;
    }
    Pump();
    Unref();  // the engine never saw the request
  }

  // On the engine thread, right after the lease is granted: asks the prefill worker to
  // fill it. The reply (gRPC thread) posts the commit or the failure.
  void StartRemotePrefill(const engine::RemotePrefillLease& lease, const std::string& prefill_address,
                          const v1::SamplingParams& sampling, const std::vector<int32_t>& prompt) {
    const std::string transfer_id = absl::StrCat(state_.worker_id(), "/", lease.transfer_id.value);
    WorkerState::Lease entry{.id = lease.transfer_id, .index_of_block = {}};
    for (int32_t i = lease.num_cached_blocks(); i < lease.num_blocks(); ++i) {
      entry.index_of_block[lease.block_ids[i].value] = i;
    }
    state_.AddLease(transfer_id, std::move(entry));

    struct Call {
      grpc::ClientContext context;
      v1::PrefillRequest request;
      v1::PrefillResponse response;
      std::unique_ptr<v1::Worker::Stub> stub;
    };
    auto call = std::make_shared<Call>();
    call->request.set_request_id(request_id_);
    call->request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    *call->request.mutable_sampling() = sampling;
    v1::KvDestination* dest = call->request.mutable_destination();
    dest->set_decode_worker_address(state_.address());
    dest->set_transfer_id(transfer_id);
    v1::RankBlocks* blocks = dest->add_blocks_per_rank();
    blocks->set_rank(0);
    for (int32_t i = lease.num_cached_blocks(); i < lease.num_blocks(); ++i) blocks->add_block_ids(lease.block_ids[i].value);
    *dest->mutable_kv_cache_spec() = state_.spec();
    dest->set_num_skip_blocks(lease.num_cached_blocks());
    dest->set_transport(v1::KV_TRANSPORT_GRPC_STREAM);
    rpc::SetTimeout(&call->context, state_.lease_timeout_ms());
    call->stub = v1::Worker::NewStub(state_.Channel(prefill_address));
    const engine::KvTransferId id = lease.transfer_id;
    WorkerState* state = &state_;
    const bool want_logprobs = sampling.has_logprobs();
    call->stub->async()->Prefill(
        &call->context, &call->request, &call->response,
        [call, state, id, transfer_id, prefill_address, want_logprobs](grpc::Status status) {
          state->RemoveLease(transfer_id);
          if (!status.ok()) {
            const absl::Status s = rpc::FromGrpcStatus(status);
            const absl::Status failure(s.code(), absl::StrCat("remote prefill on ", prefill_address, " failed: ",
                                                              s.message()));
            KVMESH_LOG(kWarning) << "remote prefill failed" << LogKv("transfer", transfer_id)
                                 << LogKv("status", failure.ToString());
            state->engine().Post([id, failure](engine::Engine& e) { (void)e.FailRemotePrefill(id, failure); });
            return;
          }
          std::optional<engine::SampleResult> logprobs;
          if (want_logprobs) logprobs = rpc::SampleResultFromProto(call->response.first_logprob());
          const int32_t first = call->response.first_token_id();
          state->engine().Post([id, first, logprobs](engine::Engine& e) {
            auto committed = e.CommitRemotePrefill(id, first, logprobs);
            if (!committed.ok() && !absl::IsFailedPrecondition(committed.status())) {
              (void)e.FailRemotePrefill(id, committed.status());
            } else if (!committed.ok()) {
              // Not all blocks arrived (or the lease ended meanwhile: then this fails too, harmlessly).
              (void)e.FailRemotePrefill(id, absl::DataLossError(absl::StrCat("KV transfer incomplete: ",
                                                                             committed.status().message())));
            }
          });
        });
  }

  // Engine thread.
  void OnOutput(const engine::RequestOutput& out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const engine::CompletionOutput& c : out.outputs) {
        v1::WorkerGenerateResponse response;
        response.set_request_id(out.request_id);
        response.set_index(c.index);
        response.mutable_token_ids()->Add(c.new_token_ids.begin(), c.new_token_ids.end());
        for (const engine::SampleResult& r : c.new_logprobs) rpc::SampleResultToProto(r, response.add_logprobs());
        response.set_finish_reason(rpc::FinishReasonToProto(c.finish_reason));
        if (c.stop_token_id) response.set_stop_token_id(*c.stop_token_id);
        if (!sent_first_[c.index]) {
          sent_first_[c.index] = true;
          response.set_num_prompt_tokens(out.num_prompt_tokens);
          response.set_num_cached_tokens(out.num_cached_prompt_tokens);
        }
        if (!out.status.ok() && c.finish_reason == engine::CompletionFinishReason::kError) continue;
        queue_.push_back(std::move(response));
      }
      if (out.finished) finish_status_ = out.status;
    }
    Pump();
    if (out.finished) {
      state_.RemoveLive(request_id_);
      Unref();
    }
  }

  void Pump() {
    std::unique_lock<std::mutex> lock(mu_);
    if (writing_ || finish_called_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      lock.unlock();
      StartWrite(&current_);
      return;
    }
    if (finish_status_.has_value()) {
      finish_called_ = true;
      const absl::Status s = *finish_status_;
      lock.unlock();
      Finish(rpc::ToGrpcStatus(s));
    }
  }

  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  WorkerState& state_;
  const std::string request_id_;
  std::atomic<int> refs_{2};  // gRPC + the engine
  std::mutex mu_;
  std::deque<v1::WorkerGenerateResponse> queue_;
  v1::WorkerGenerateResponse current_;
  bool writing_ = false;
  bool finish_called_ = false;
  std::optional<absl::Status> finish_status_;
  absl::flat_hash_map<int32_t, bool> sent_first_;
};

// ---------------------------------------------------------------------------------------
// PushKvBlocks: reads chunks, checks them and posts their imports; finishes once every
// posted import has run.
class PushReactor : public grpc::ServerReadReactor<v1::KvBlockChunk> {
 public:
  PushReactor(WorkerState& state, v1::KvPushAck* ack) : state_(state), ack_(ack) { StartRead(&chunk_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::unique_lock<std::mutex> lock(mu_);
      reading_done_ = true;
      MaybeFinishLocked(lock);
      return;
    }
    const absl::Status s = Accept(chunk_);
    std::unique_lock<std::mutex> lock(mu_);
    if (!s.ok()) {
      if (error_.ok()) error_ = s;
      reading_done_ = true;
      MaybeFinishLocked(lock);
      return;
    }
    lock.unlock();
    StartRead(&chunk_);
  }
  void OnDone() override { delete this; }

 private:
  absl::Status Accept(const v1::KvBlockChunk& chunk) {
    const std::string& payload = chunk.payload();
    if (XXH64(payload.data(), payload.size(), 0) != chunk.checksum_xxh64()) {
      return absl::DataLossError(absl::StrCat("KV chunk ", chunk.sequence(), " of transfer ", chunk.transfer_id(),
                                              ": checksum mismatch"));
    }
    std::optional<WorkerState::Lease> lease = state_.FindLease(chunk.transfer_id());
    if (!lease) return absl::NotFoundError(absl::StrCat("unknown KV transfer '", chunk.transfer_id(), "'"));
    if (chunk.rank() != 0) return absl::InvalidArgumentError(absl::StrCat("rank ", chunk.rank(), ": this worker has 1"));
    const int64_t block_bytes = state_.block_spec().block_bytes;
    if (static_cast<int64_t>(payload.size()) != block_bytes * chunk.block_ids_size()) {
      return absl::DataLossError(absl::StrCat("KV chunk of ", payload.size(), " bytes for ", chunk.block_ids_size(),
                                              " blocks of ", block_bytes, " bytes"));
    }
    auto indices = std::make_shared<std::vector<int32_t>>();
    for (int32_t block : chunk.block_ids()) {
      const auto it = lease->index_of_block.find(block);
      if (it == lease->index_of_block.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("block ", block, " is not a destination block of transfer ", chunk.transfer_id()));
      }
      indices->push_back(it->second);
    }
    auto data = std::make_shared<std::string>(payload);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++pending_;
      ++num_chunks_;
      num_bytes_ += static_cast<int64_t>(payload.size());
      if (chunk.last()) committed_.push_back(chunk.transfer_id());
    }
    const engine::KvTransferId id = lease->id;
    const int32_t layer = chunk.layer();
    state_.engine().Post([this, id, layer, indices, data, block_bytes](engine::Engine& e) {
      absl::Status s;
      for (size_t i = 0; i < indices->size() && s.ok(); ++i) {
        s = e.ImportKvBlock(
            id, layer, (*indices)[i],
            std::span<const std::byte>(reinterpret_cast<const std::byte*>(data->data()) + i * block_bytes,
                                       static_cast<size_t>(block_bytes)));
      }
      std::unique_lock<std::mutex> lock(mu_);
      --pending_;
      if (!s.ok() && error_.ok()) error_ = s;
      MaybeFinishLocked(lock);
    });
    return absl::OkStatus();
  }

  void MaybeFinishLocked(std::unique_lock<std::mutex>& lock) {
    if (!reading_done_ || pending_ > 0 || finished_) return;
    finished_ = true;
    for (const std::string& id : committed_) ack_->add_committed_transfer_ids(id);
    ack_->set_num_chunks(num_chunks_);
    ack_->set_num_bytes(num_bytes_);
    const absl::Status s = error_;
    lock.unlock();
    Finish(rpc::ToGrpcStatus(s));
  }

  WorkerState& state_;
  v1::KvPushAck* ack_;
  v1::KvBlockChunk chunk_;
  std::mutex mu_;
  int pending_ = 0;
  bool reading_done_ = false;
  bool finished_ = false;
  absl::Status error_;
  std::vector<std::string> committed_;
  int64_t num_chunks_ = 0;
  int64_t num_bytes_ = 0;
};

// ---------------------------------------------------------------------------------------
// Prefill: one prefill-only request; its KV is pushed from a sender thread once computed.
class PrefillJob : public std::enable_shared_from_this<PrefillJob> {
 public:
  PrefillJob(WorkerState& state, grpc::ServerUnaryReactor* reactor, const v1::PrefillRequest* request,
             v1::PrefillResponse* response)
      : state_(state), reactor_(reactor), request_(*request), response_(response) {}

  void Start() {
    const v1::KvDestination& dest = request_.destination();
    if (!SameSpec(dest.kv_cache_spec(), state_.spec())) {
      return Respond(absl::InvalidArgumentError("destination kv_cache_spec differs from this worker's"));
    }
    if (dest.transport() == v1::KV_TRANSPORT_UCX) {
      return Respond(absl::UnimplementedError("KV_TRANSPORT_UCX: this worker pushes over gRPC only"));
    }
    if (dest.blocks_per_rank_size() != 1 || dest.decode_worker_address().empty() || dest.num_skip_blocks() < 0) {
      return Respond(absl::InvalidArgumentError("destination: one rank's blocks and an address are required"));
    }
    auto r = state_.ToEngineRequest(request_.request_id(), request_.prompt_token_ids(), request_.sampling(), {});
    if (!r.ok()) return Respond(r.status());
    // Ids of concurrent prefills for several decode workers could collide: qualify them.
    engine_id_ = absl::StrCat(dest.transfer_id(), "#", request_.request_id());
    r->request_id = engine_id_;
    auto self = shared_from_this();
    r->on_output = [self](const engine::RequestOutput& out) { self->OnOutput(out); };
    const int32_t skip = dest.num_skip_blocks() * state_.block_spec().block_size_tokens;
    const absl::Status s = state_.engine().SubmitWith(
        *std::move(r), [skip](engine::Engine& e, engine::EngineRequest req) {
          return e.AddPrefillOnlyRequest(std::move(req), skip);
        });
    if (!s.ok()) Respond(s);
  }

 private:
  // Engine thread.
  void OnOutput(const engine::RequestOutput& out) {
    if (out.prefill_result.has_value()) {
      result_ = *out.prefill_result;
      // Export on the engine thread (the spans are valid until release), after Deliver.
      auto self = shared_from_this();
      state_.engine().Post([self](engine::Engine& e) { self->Export(e); });
    }
    if (out.finished && !out.status.ok()) Respond(out.status);
  }

  // Engine thread: copies the blocks to send, then hands them to a sender thread.
  void Export(engine::Engine& e) {
    const v1::RankBlocks& dest = request_.destination().blocks_per_rank(0);
    const int32_t skip = result_.num_skipped_blocks;
    const int32_t num_blocks = static_cast<int32_t>(result_.block_ids.size());
    if (num_blocks - skip != dest.block_ids_size()) {
      Release(e, absl::InvalidArgumentError(absl::StrCat("destination has ", dest.block_ids_size(),
                                                         " blocks; the prompt needs ", num_blocks - skip)));
      return;
    }
    auto layers = std::make_shared<std::vector<std::string>>();
    const int64_t block_bytes = state_.block_spec().block_bytes;
    for (int32_t layer = 0; layer < state_.block_spec().num_layers; ++layer) {
      std::string& bytes = layers->emplace_back();
      bytes.reserve(static_cast<size_t>(block_bytes * (num_blocks - skip)));
      for (int32_t b = skip; b < num_blocks; ++b) {
        auto span = e.ExportKvBlock(engine_id_, layer, b);
        if (!span.ok()) {
          Release(e, span.status());
          return;
        }
        bytes.append(reinterpret_cast<const char*>(span->data()), span->size());
      }
    }
    auto self = shared_from_this();
    std::thread([self, layers] { self->Send(*layers); }).detach();
  }

  // Sender thread: PushKvBlocks, then reply, then release.
  void Send(const std::vector<std::string>& layers) {
    const v1::KvDestination& dest = request_.destination();
    const v1::RankBlocks& blocks = dest.blocks_per_rank(0);
    const int64_t block_bytes = state_.block_spec().block_bytes;
    const size_t blocks_per_chunk = std::max<size_t>(1, kMaxChunkBytes / static_cast<size_t>(block_bytes));
    auto stub = v1::Worker::NewStub(state_.Channel(dest.decode_worker_address()));
    grpc::ClientContext context;
    rpc::SetTimeout(&context, state_.lease_timeout_ms());
    v1::KvPushAck ack;
    std::unique_ptr<grpc::ClientWriter<v1::KvBlockChunk>> writer = stub->PushKvBlocks(&context, &ack);
    uint32_t sequence = 0;
    int64_t sent = 0;
    const size_t total_blocks = static_cast<size_t>(blocks.block_ids_size());
    for (size_t layer = 0; layer < layers.size(); ++layer) {
      for (size_t first = 0; first < total_blocks; first += blocks_per_chunk) {
        const size_t n = std::min(blocks_per_chunk, total_blocks - first);
        v1::KvBlockChunk chunk;
        chunk.set_transfer_id(dest.transfer_id());
        chunk.set_rank(0);
        chunk.set_layer(static_cast<int32_t>(layer));
        for (size_t i = first; i < first + n; ++i) chunk.add_block_ids(blocks.block_ids(static_cast<int>(i)));
        chunk.set_payload(layers[layer].substr(first * block_bytes, n * block_bytes));
        chunk.set_checksum_xxh64(XXH64(chunk.payload().data(), chunk.payload().size(), 0));
        chunk.set_sequence(sequence++);
        chunk.set_last(layer + 1 == layers.size() && first + n >= total_blocks);
        sent += static_cast<int64_t>(chunk.payload().size());
        if (!writer->Write(chunk)) break;
      }
    }
    writer->WritesDone();
    absl::Status status = rpc::FromGrpcStatus(writer->Finish());
    if (!status.ok()) {
      status = absl::Status(status.code(), absl::StrCat("pushing KV to ", dest.decode_worker_address(), ": ",
                                                        status.message()));
    }
    Respond(status, [&] {
      if (!status.ok()) return;
      response_->set_first_token_id(result_.first_token_id);
      if (result_.first_token_logprobs) {
        rpc::SampleResultToProto(*result_.first_token_logprobs, response_->mutable_first_logprob());
      }
      response_->set_num_cached_tokens(result_.num_cached_tokens);
      response_->set_kv_bytes_sent(sent);
    });
    auto self = shared_from_this();
    state_.engine().Post([self](engine::Engine& e) { (void)e.ReleasePrefill(self->engine_id_); });
  }

  void Release(engine::Engine& e, const absl::Status& status) {
    Respond(status);
    (void)e.ReleasePrefill(engine_id_);
  }

  // Answers the call once (later answers are dropped); `fill` writes the response first.
  void Respond(const absl::Status& status, const std::function<void()>& fill = nullptr) {
    if (responded_.exchange(true)) return;
    if (fill) fill();
    reactor_->Finish(rpc::ToGrpcStatus(status));
  }

  WorkerState& state_;
  grpc::ServerUnaryReactor* reactor_;
  // A copy: the call's own request dies with Finish, which a release timeout may
  // trigger while the sender thread still reads the destination.
  const v1::PrefillRequest request_;
  v1::PrefillResponse* response_;  // written only inside Respond, before Finish
  std::string engine_id_;
  engine::PrefillResult result_;  // written on the engine thread before Export is posted
  std::atomic<bool> responded_{false};
};

}  // namespace

grpc::ServerWriteReactor<v1::WorkerGenerateResponse>* WorkerService::Generate(
    grpc::CallbackServerContext* context, const v1::WorkerGenerateRequest* request) {
  return new GenerateReactor(state_, context, request);
}

grpc::ServerUnaryReactor* WorkerService::Prefill(grpc::CallbackServerContext* context,
                                                 const v1::PrefillRequest* request, v1::PrefillResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::make_shared<PrefillJob>(state_, reactor, request, response)->Start();
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::Abort(grpc::CallbackServerContext* context, const v1::AbortRequest* request,
                                               v1::AbortResponse* response) {
  response->set_found(state_.IsLive(request->request_id()));
  state_.engine().Abort(request->request_id());
  return rpc::FinishUnary(context, absl::OkStatus());
}

grpc::ServerReadReactor<v1::KvBlockChunk>* WorkerService::PushKvBlocks(grpc::CallbackServerContext* /*context*/,
                                                                       v1::KvPushAck* ack) {
  return new PushReactor(state_, ack);
}

}  // namespace kvmesh::cli
