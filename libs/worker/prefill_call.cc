#include "worker/prefill_call.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "worker/kv_push_stream.h"
#include "rpc/cancel_before_done.h"
#include "rpc/status_conversion.h"

namespace kvmesh::worker {
namespace {

// Chunks of at most this many payload bytes on PushKvBlocks (a layer's blocks usually
// fit in one).
constexpr size_t kMaxChunkBytes = 4 << 20;

// KV layouts must match field for field (the proto has no == operator).
bool SameSpec(const v1::KvCacheSpec& a, const v1::KvCacheSpec& b) {
  return a.block_size_tokens() == b.block_size_tokens() && a.num_layers() == b.num_layers() &&
         a.num_kv_heads() == b.num_kv_heads() && a.head_dim() == b.head_dim() && a.dtype() == b.dtype() &&
         a.tp_size() == b.tp_size() && a.block_hash_salt() == b.block_hash_salt();
}

class PrefillJob : public std::enable_shared_from_this<PrefillJob> {
 public:
  PrefillJob(WorkerState& state, grpc::ServerUnaryReactor* reactor, const v1::PrefillRequest& request,
             v1::PrefillResponse* response)
      : state_(state), reactor_(reactor), request_(request), response_(response) {}

  void Start() {
    const v1::KvDestination& dest = request_.destination();
    // KV moves rank to rank: the two tensor-parallel groups must have the same size.
    if (dest.kv_cache_spec().tp_size() != state_.spec().tp_size()) {
      return Respond(absl::InvalidArgumentError(absl::StrCat(
          "the decode worker has tensor-parallel size ", dest.kv_cache_spec().tp_size(), ", this prefill worker ",
          state_.spec().tp_size(), ": KV moves rank to rank, so both sides need the same size")));
    }
    if (!SameSpec(dest.kv_cache_spec(), state_.spec())) {
      return Respond(absl::InvalidArgumentError("destination kv_cache_spec differs from this worker's"));
    }
    // UCX when the decode side offers it and this worker has it; else the gRPC stream
    // (the decode side learns which from kv_transport_used).
    const bool offer_ucx = dest.transport() == v1::KV_TRANSPORT_UCX && dest.kv_lease_descriptors_size() > 0 &&
                           state_.has_kv_transport();
    if (dest.blocks_per_rank_size() != state_.tp_size() || dest.decode_worker_address().empty() ||
        dest.num_skip_blocks() < 0) {
      return Respond(absl::InvalidArgumentError(absl::StrCat("destination: blocks for each of the ", state_.tp_size(),
                                                             " ranks and an address are required")));
    }
    const int32_t block_size = state_.block_spec().block_size_tokens;
    const int32_t num_prompt_blocks = (request_.prompt_token_ids_size() + block_size - 1) / block_size;
    for (const v1::RankBlocks& rank_blocks : dest.blocks_per_rank()) {
      if (request_.prompt_token_ids_size() > 0 &&
          rank_blocks.block_ids_size() != num_prompt_blocks - dest.num_skip_blocks()) {
        return Respond(absl::InvalidArgumentError(
            absl::StrCat("destination has ", rank_blocks.block_ids_size(), " blocks for rank ", rank_blocks.rank(),
                         " after skipping ", dest.num_skip_blocks(), "; the prompt has ", num_prompt_blocks)));
      }
    }
    auto r = state_.ToEngineRequest(request_.request_id(), request_.prompt_token_ids(), request_.sampling(), {});
    if (!r.ok()) return Respond(r.status());
    r->cache_salt = request_.cache_salt();
    // Ids of concurrent prefills for several decode workers could collide: qualify them.
    engine_id_ = absl::StrCat(dest.transfer_id(), "#", request_.request_id());
    r->request_id = engine_id_;
    auto self = shared_from_this();
    r->on_output = [self](const engine::RequestOutput& out) { self->OnOutput(out); };
    // The transfer opens now, so its connection is ready when the first layer is.
    start_ = std::chrono::steady_clock::now();
    if (offer_ucx) {
      // Blocks for one round trip: the receiver refuses an unknown lease before anything is put.
      const std::vector<std::string> descriptors(dest.kv_lease_descriptors().begin(),
                                                 dest.kv_lease_descriptors().end());
      absl::StatusOr<std::unique_ptr<kv::KvRankGroupPush>> push =
          kv::KvRankGroupPush::Open(state_.kv_rank_pools(), descriptors);
      if (push.ok()) {
        ucx_ = *std::move(push);
      } else if (!absl::IsUnavailable(push.status())) {
        if (KvTransferMetrics* m = state_.transfer_metrics()) {
          m->EndTransfer(KvTransferMetrics::Direction::kSent, KvTransferMetrics::Transport::kUcx, 0, 0,
                         push.status());
        }
        return Respond(absl::Status(push.status().code(),
                                    absl::StrCat("KV lease from ", dest.decode_worker_address(), ": ",
                                                 push.status().message())));
      } else {
        KVMESH_LOG(kWarning) << "UCX unreachable, pushing KV over gRPC" << LogKv("request", request_.request_id())
                             << LogKv("status", push.status().ToString());
      }
    }
    if (ucx_ == nullptr) {
      absl::StatusOr<std::shared_ptr<KvPushStream>> push = KvPushStream::Start(
          state_.Channel(dest.decode_worker_address()), dest.transfer_id(), state_.lease_timeout_ms(),
          [self](const absl::Status& status, const v1::KvPushAck&, int64_t bytes) { self->OnPushDone(status, bytes); },
          &state_.outgoing_calls());
      if (!push.ok()) return Respond(push.status());  // the worker is stopping
      push_ = *std::move(push);
    }
    engine::KvLayerSink sink;
    if (state_.stream_kv_layers()) {
      sink = [self](const engine::KvLayerBlocks& blocks) { self->SendLayer(blocks); };
    }
    const int32_t skip = dest.num_skip_blocks() * block_size;
    const absl::Status s = state_.engine().SubmitWith(
        *std::move(r), [skip, sink = std::move(sink)](engine::Engine& e, engine::EngineRequest req) mutable {
          return e.AddPrefillOnlyRequest(std::move(req), skip, std::move(sink));
        });
    if (!s.ok()) {
      CancelTransfer();
      Respond(s);
    }
  }

  // The caller went away: stop computing, free the blocks, drop the stream.
  void Cancel() {
    if (!engine_id_.empty()) state_.engine().Abort(engine_id_);
    CancelTransfer();
    Respond(absl::CancelledError("the decode side cancelled the prefill"));
  }

 private:
  void CancelTransfer() {
    if (ucx_) ucx_->Cancel();
    if (push_) push_->Cancel();
  }

  // Engine thread, between two layers: queues one put per merged run (UCX; posted on the
  // transport's thread), or copies the layer's finished blocks into chunks (gRPC).
  void SendLayer(const engine::KvLayerBlocks& blocks) {
    const v1::KvDestination& dest = request_.destination();
    if (ucx_) {
      if (ucx_refused_) return;  // cancelled at the first refusal: later layers go nowhere
      std::vector<kv::BlockId> ids;
      ids.reserve(blocks.blocks.size());
      absl::Status s;
      for (const std::span<const std::byte>& b : blocks.blocks) {
        absl::StatusOr<kv::BlockId> id = state_.PoolBlockOf(blocks.rank, blocks.layer, b);
        if (!id.ok()) {
          s = id.status();
          break;
        }
        ids.push_back(*id);
      }
      if (s.ok()) s = ucx_->PutLayer(blocks.rank, blocks.layer, blocks.first_block_index - dest.num_skip_blocks(), ids);
      if (!s.ok()) {
        // The transfer is over; Finish reports it (and the decode side fails its lease).
        KVMESH_LOG(kWarning) << "UCX put refused" << LogKv("request", request_.request_id())
                             << LogKv("status", s.ToString());
        ucx_refused_ = true;
        ucx_->Cancel();
      }
      return;
    }
    const v1::RankBlocks& dest_blocks = dest.blocks_per_rank(blocks.rank);
    const int32_t skip = dest.num_skip_blocks();
    const size_t block_bytes = static_cast<size_t>(state_.block_spec().block_bytes);
    const size_t per_chunk = std::max<size_t>(1, kMaxChunkBytes / block_bytes);
    for (size_t first = 0; first < blocks.blocks.size(); first += per_chunk) {
      const size_t n = std::min(per_chunk, blocks.blocks.size() - first);
      v1::KvBlockChunk chunk;
      chunk.set_transfer_id(dest.transfer_id());
      chunk.set_rank(blocks.rank);
      chunk.set_layer(blocks.layer);
      std::string* payload = chunk.mutable_payload();
      payload->reserve(n * block_bytes);
      for (size_t i = first; i < first + n; ++i) {
        chunk.add_block_ids(dest_blocks.block_ids(blocks.first_block_index + static_cast<int32_t>(i) - skip));
        payload->append(reinterpret_cast<const char*>(blocks.blocks[i].data()), blocks.blocks[i].size());
      }
      push_->Write(std::move(chunk));
    }
  }

  // Engine thread, after the prefill, when layers are not streamed: the same chunks as
  // SendLayer's, all at once (the pre-overlap behaviour, kept for comparison).
  void SendAllLayers(engine::Engine& e, int32_t num_blocks) {
    const int32_t skip = request_.destination().num_skip_blocks();
    std::vector<std::span<const std::byte>> spans;
    for (int32_t layer = 0; layer < state_.block_spec().num_layers; ++layer) {
      for (int32_t rank = 0; rank < state_.tp_size(); ++rank) {
        spans.clear();
        for (int32_t b = skip; b < num_blocks; ++b) {
          absl::StatusOr<std::span<const std::byte>> span = e.ExportKvBlock(engine_id_, rank, layer, b);
          if (!span.ok()) {
            CancelTransfer();
            return Respond(span.status());
          }
          spans.push_back(*span);
        }
        SendLayer(engine::KvLayerBlocks{.rank = rank, .layer = layer, .first_block_index = skip, .blocks = spans});
      }
    }
  }

  // Engine thread.
  void OnOutput(const engine::RequestOutput& out) {
    if (out.prefill_result.has_value()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        result_ = *out.prefill_result;
        computed_at_ = std::chrono::steady_clock::now();
      }
      if (serving::ServingMetrics* m = state_.serving_metrics()) m->AddPromptTokens(request_.prompt_token_ids_size());
      // Streamed: every block went through SendLayer already. Otherwise (after the
      // callback: the engine is not to be called from it) copy them all now. Then unpin
      // them (they stay cached) and end the stream.
      auto self = shared_from_this();
      const bool streamed = state_.stream_kv_layers();
      const int32_t num_blocks = static_cast<int32_t>(out.prefill_result->block_ids.size());
      state_.engine().Post([self, streamed, num_blocks](engine::Engine& e) {
        if (!streamed) self->SendAllLayers(e, num_blocks);
        if (self->ucx_) {
          // The puts read the blocks until the flush: they stay pinned until Finish's answer.
          self->ucx_->Finish([self](const absl::Status& status, const kv::KvTransferStats& stats) {
            self->state_.engine().Post([self](engine::Engine& e) { (void)e.ReleasePrefill(self->engine_id_); });
            self->OnUcxDone(status, stats);
          });
          return;
        }
        (void)e.ReleasePrefill(self->engine_id_);
        self->push_->Close();
      });
      return;
    }
    if (!out.finished) return;
    bool computed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      computed = result_.has_value();
    }
    if (computed) return;  // the release after the result
    CancelTransfer();
    Respond(out.status.ok() ? absl::AbortedError("the prefill was aborted before its prompt was computed")
                            : out.status);
  }

  // The transport's thread: every put landed and the receiver counted them (or not).
  void OnUcxDone(const absl::Status& status, const kv::KvTransferStats& stats) {
    if (KvTransferMetrics* m = state_.transfer_metrics()) {
      m->AddBytes(KvTransferMetrics::Direction::kSent, stats.bytes);
      m->EndStream(KvTransferMetrics::Direction::kSent, stats.seconds, status.ok());
      m->EndTransfer(KvTransferMetrics::Direction::kSent, KvTransferMetrics::Transport::kUcx, stats.descriptors,
                     stats.runs, status, stats.seconds > 0 ? static_cast<double>(stats.bytes) / stats.seconds / 1e9 : 0);
    }
    if (!status.ok()) {
      state_.engine().Abort(engine_id_);
      return Respond(absl::Status(status.code(), absl::StrCat("putting KV over UCX to ",
                                                              request_.destination().decode_worker_address(), ": ",
                                                              status.message())));
    }
    RespondComputed(stats.bytes, v1::KV_TRANSPORT_UCX, stats.descriptors);
  }

  // gRPC thread: the receiver imported everything (or the push failed).
  void OnPushDone(const absl::Status& status, int64_t bytes) {
    if (KvTransferMetrics* m = state_.transfer_metrics()) {
      m->AddBytes(KvTransferMetrics::Direction::kSent, bytes);
      m->EndStream(KvTransferMetrics::Direction::kSent,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(), status.ok());
      m->EndTransfer(KvTransferMetrics::Direction::kSent, KvTransferMetrics::Transport::kGrpc, 0, 0, status);
    }
    if (!status.ok()) {
      state_.engine().Abort(engine_id_);
      return Respond(absl::Status(status.code(), absl::StrCat("pushing KV to ",
                                                              request_.destination().decode_worker_address(), ": ",
                                                              status.message())));
    }
    RespondComputed(bytes, v1::KV_TRANSPORT_GRPC_STREAM, 0);
  }

  // The KV is on the decode side: answer with the first token.
  void RespondComputed(int64_t bytes, v1::KvTransport transport, int64_t descriptors) {
    std::optional<engine::PrefillResult> result;
    std::chrono::steady_clock::time_point computed_at;
    {
      std::lock_guard<std::mutex> lock(mu_);
      result = result_;
      computed_at = computed_at_;
    }
    if (!result) return Respond(absl::InternalError("the KV push ended before the prompt was computed"));
    // The transfer time the prefill did not hide: from the prompt computed to every
    // block imported on the decode side (what layered streaming shrinks).
    const auto now = std::chrono::steady_clock::now();
    if (KvTransferMetrics* m = state_.transfer_metrics()) {
      m->ObserveTail(std::chrono::duration<double>(now - computed_at).count());
    }
    KVMESH_LOG(kDebug) << "prefill pushed" << LogKv("request", request_.request_id()) << LogKv("bytes", bytes)
                       << LogKv("push_ms", std::chrono::duration<double, std::milli>(now - start_).count())
                       << LogKv("tail_ms", std::chrono::duration<double, std::milli>(now - computed_at).count());
    Respond(absl::OkStatus(), [&] {
      response_->set_first_token_id(result->first_token_id);
      if (result->first_token_logprobs) {
        rpc::SampleResultToProto(*result->first_token_logprobs, response_->mutable_first_logprob());
      }
      response_->set_num_cached_tokens(result->num_cached_tokens);
      response_->set_kv_bytes_sent(bytes);
      response_->set_kv_transport_used(transport);
      response_->set_kv_descriptors(descriptors);
    });
  }

  // Answers the call once (later answers are dropped); `fill` writes the response first.
  void Respond(const absl::Status& status, const std::function<void()>& fill = nullptr) {
    if (responded_.exchange(true)) return;
    if (fill) fill();
    reactor_->Finish(rpc::ToGrpcStatus(status));
  }

  WorkerState& state_;
  grpc::ServerUnaryReactor* reactor_;  // valid until Respond's Finish; never used after
  // A copy: the call's own request dies with Finish, which a cancellation may trigger
  // while the engine thread still reads the destination.
  const v1::PrefillRequest request_;
  v1::PrefillResponse* response_;  // written only inside Respond, before Finish
  std::string engine_id_;          // set in Start, before any callback can run
  std::chrono::steady_clock::time_point start_;
  std::shared_ptr<KvPushStream> push_;  // gRPC: set in Start, before the engine sees the request
  std::unique_ptr<kv::KvRankGroupPush> ucx_;  // UCX: set in Start, before the engine sees the request
  bool ucx_refused_ = false;                   // engine thread: a layer's put was refused, ucx_ cancelled
  std::atomic<bool> responded_{false};
  std::mutex mu_;
  std::optional<engine::PrefillResult> result_;  // guarded by mu_
  std::chrono::steady_clock::time_point computed_at_;  // guarded by mu_: when result_ came
};

// The call's reactor: forwards cancellation and keeps the job alive until gRPC is done.
class PrefillReactor : public grpc::ServerUnaryReactor {
 public:
  void Begin(WorkerState& state, const v1::PrefillRequest* request, v1::PrefillResponse* response) {
    job_ = std::make_shared<PrefillJob>(state, this, *request, response);
    job_->Start();
  }
  void OnCancel() override {
    job_->Cancel();
    cancel_order_.CancelReturned();
  }
  void OnDone() override {
    cancel_order_.DoneStarts();
    delete this;
  }

 private:
  std::shared_ptr<PrefillJob> job_;
  rpc::CancelBeforeDone cancel_order_;
};

}  // namespace

grpc::ServerUnaryReactor* StartPrefillCall(WorkerState& state, const v1::PrefillRequest* request,
                                           v1::PrefillResponse* response) {
  auto* reactor = new PrefillReactor();
  reactor->Begin(state, request, response);
  return reactor;
}

}  // namespace kvmesh::worker
