// AdmissionController: the one admission path of both front doors (REST OpenAiService
// and gRPC GrpcInferenceService), so that one client cannot hurt the others:
//
//   1. Shape limits, checked before any work (tokenizing a 100,000-prompt array is
//      work): prompts per request, stop strings (count and bytes each) -> InvalidArgument
//      naming the field. Then, once tokenized, total prompt tokens per request.
//   2. Capacity: a request holds n x prompts sequences while in flight, and the
//      sequences in flight are bounded (max_inflight_sequences) -> ResourceExhausted.
//   3. Per-API-key token buckets (requests/s and tokens/s; a request costs its prompt
//      tokens plus n x prompts x max_tokens, what it may make the engine compute)
//      -> ResourceExhausted with a Retry-After (core/retry_after.h) saying when the
//      bucket will hold enough. A bucket that is full admits a request larger than its
//      burst and goes into debt, so a large request is paced rather than never served.
//   4. Fairness between keys: a per-key in-flight cap equal to the capacity divided by
//      the number of keys active in the last `fairness_window_s` (refused requests
//      count as activity) -> ResourceExhausted with Retry-After 1.
//
// NOTE on the fairness choice: a fair share of in-flight sequences rather than per-key
// queues served round robin. The front doors admit or refuse at once and hold no
// queue (the engine's scheduler is the queue), so round robin would need a second
// queue in front of the engine, with its own memory and timeouts. The cap gives the
// same outcome where it matters: with one key active it may use the whole capacity;
// when a second key shows up, the first is refused beyond half, so slots it frees go to
// the newcomer instead of back to the client that floods.
//
// Keys: the API key the request authenticated with ("" without --api-keys: everyone
// shares one bucket). Per-key state is kept only for keys seen within the window, so
// it is bounded by the number of configured keys (+ the anonymous one).
//
// Thread-safety: thread-safe. A Ticket must not outlive its controller.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace kvmesh::serving {

struct AdmissionOptions {
  // Sequences (n x prompts) in flight at once, over all keys.
  int32_t max_inflight_sequences = 256;
  int32_t max_prompts_per_request = 256;
  int64_t max_prompt_tokens_per_request = 1 << 20;
  int32_t max_stop_strings = 16;
  int32_t max_stop_string_bytes = 256;
  // Per API key; 0 disables the bucket. A burst of 0 means one second's worth (at
  // least 1 request).
  double key_requests_per_s = 0;
  double key_request_burst = 0;
  double key_tokens_per_s = 0;
  double key_token_burst = 0;
  // Fair share (4. above); false: only the global bound applies.
  bool fair_share = true;
  double fairness_window_s = 10;
  // Monotonic seconds; tests inject a fake. Default: std::chrono::steady_clock.
  std::function<double()> now_s;
};

// What a request asks for, as the front door knows it before / after tokenizing.
struct RequestShape {
  int64_t num_prompts = 1;
  int64_t n = 1;  // samples per prompt
  int64_t max_tokens = 0;  // per sample
  int64_t prompt_tokens = 0;  // summed over prompts; 0 before tokenizing
  const std::vector<std::string>* stop = nullptr;  // may be null
};

class AdmissionController {
 public:
  // Holds the sequences of one admitted request; releases them when destroyed.
  class Ticket {
   public:
    Ticket() = default;
    ~Ticket();
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    bool held() const { return controller_ != nullptr; }

   private:
    friend class AdmissionController;
    AdmissionController* controller_ = nullptr;
    std::string key_;
    int64_t sequences_ = 0;
  };

  // InvalidArgument for a limit below 1 (a rate or burst below 0).
  static absl::StatusOr<std::unique_ptr<AdmissionController>> Create(AdmissionOptions options);

  // 1. above, before tokenizing: InvalidArgument naming the field ("prompt",
  // "stop", "n").
  absl::Status CheckShape(const RequestShape& shape) const;

  // 1. (prompt tokens), 2., 3. and 4. above, after tokenizing. ResourceExhausted
  // carries a Retry-After. On success the ticket holds n x num_prompts sequences.
  absl::StatusOr<Ticket> Admit(std::string_view key, const RequestShape& shape);

  const AdmissionOptions& options() const { return options_; }
  int64_t inflight_sequences() const;

 private:
  struct Bucket {
    double level = 0;
    double last_s = 0;
  };
  struct KeyState {
    int64_t inflight = 0;
    double last_seen_s = 0;
    Bucket requests;
    Bucket tokens;
  };

  explicit AdmissionController(AdmissionOptions options) : options_(std::move(options)) {}
  void Release(const std::string& key, int64_t sequences);
  // Drops keys idle past the window with nothing in flight. Requires mu_.
  void ExpireLocked(double now);
  int64_t ActiveKeysLocked(double now) const;

  const AdmissionOptions options_;
  mutable std::mutex mu_;
  int64_t inflight_ = 0;                                // guarded by mu_
  absl::flat_hash_map<std::string, KeyState> keys_;      // guarded by mu_
  double last_expiry_s_ = 0;                            // guarded by mu_
};

}  // namespace kvmesh::serving
