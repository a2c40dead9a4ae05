#include "serving/admission_controller.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/retry_after.h"

namespace kvmesh::serving {
namespace {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Burst(double rate, double burst) { return burst > 0 ? burst : std::max(1.0, rate); }

void Refill(double& level, double& last_s, double rate, double burst, double now) {
  level = std::min(burst, level + rate * std::max(0.0, now - last_s));
  last_s = now;
}

// Seconds until `level` reaches `need` at `rate` (at least 1).
int64_t SecondsUntil(double level, double need, double rate) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil((need - level) / rate)));
}

absl::Status Exhausted(std::string message, int64_t retry_after_s) {
  absl::Status status = absl::ResourceExhaustedError(
      absl::StrCat(message, "; retry after ", retry_after_s, " s"));
  SetRetryAfterSeconds(status, retry_after_s);
  return status;
}

}  // namespace

AdmissionController::Ticket::~Ticket() {
  if (controller_ != nullptr) controller_->Release(key_, sequences_);
}

AdmissionController::Ticket::Ticket(Ticket&& other) noexcept
    : controller_(std::exchange(other.controller_, nullptr)),
      key_(std::move(other.key_)),
      sequences_(other.sequences_) {}

AdmissionController::Ticket& AdmissionController::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    if (controller_ != nullptr) controller_->Release(key_, sequences_);
    controller_ = std::exchange(other.controller_, nullptr);
    key_ = std::move(other.key_);
    sequences_ = other.sequences_;
  }
  return *this;
}

absl::StatusOr<std::unique_ptr<AdmissionController>> AdmissionController::Create(AdmissionOptions options) {
  if (options.max_inflight_sequences < 1 || options.max_prompts_per_request < 1 ||
      options.max_prompt_tokens_per_request < 1 || options.max_stop_strings < 0 ||
      options.max_stop_string_bytes < 1) {
    return absl::InvalidArgumentError("admission limits must be >= 1 (max_stop_strings >= 0)");
  }
  if (options.key_requests_per_s < 0 || options.key_request_burst < 0 || options.key_tokens_per_s < 0 ||
      options.key_token_burst < 0 || options.fairness_window_s <= 0) {
    return absl::InvalidArgumentError("admission rates and bursts must be >= 0 (the fairness window > 0)");
  }
  if (!options.now_s) options.now_s = SteadySeconds;
  return std::unique_ptr<AdmissionController>(new AdmissionController(std::move(options)));
}

absl::Status AdmissionController::CheckShape(const RequestShape& shape) const {
  if (shape.num_prompts > options_.max_prompts_per_request) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", shape.num_prompts, " prompts in one request; at most ",
                                                   options_.max_prompts_per_request, " are accepted"));
  }
  if (shape.stop != nullptr) {
    if (static_cast<int64_t>(shape.stop->size()) > options_.max_stop_strings) {
      return absl::InvalidArgumentError(absl::StrCat("stop: ", shape.stop->size(), " stop strings; at most ",
                                                     options_.max_stop_strings, " are accepted"));
    }
    for (size_t i = 0; i < shape.stop->size(); ++i) {
      if (static_cast<int64_t>((*shape.stop)[i].size()) > options_.max_stop_string_bytes) {
        return absl::InvalidArgumentError(absl::StrCat("stop[", i, "]: ", (*shape.stop)[i].size(),
                                                       " bytes; a stop string may have at most ",
                                                       options_.max_stop_string_bytes));
      }
    }
  }
  const int64_t sequences = shape.num_prompts * shape.n;
  if (sequences > options_.max_inflight_sequences) {
    return absl::InvalidArgumentError(absl::StrCat("n: n x prompts = ", sequences,
                                                   " sequences, more than the server ever runs at once (",
                                                   options_.max_inflight_sequences, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AdmissionController::Ticket> AdmissionController::Admit(std::string_view key_view,
                                                                       const RequestShape& shape) {
  if (absl::Status s = CheckShape(shape); !s.ok()) return s;
  if (shape.prompt_tokens > options_.max_prompt_tokens_per_request) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", shape.prompt_tokens,
                                                   " prompt tokens in one request; at most ",
                                                   options_.max_prompt_tokens_per_request, " are accepted"));
  }
  const int64_t sequences = std::max<int64_t>(1, shape.num_prompts * shape.n);
  const double token_cost =
      static_cast<double>(shape.prompt_tokens) + static_cast<double>(sequences) * static_cast<double>(shape.max_tokens);
  const std::string key(key_view);
  const double now = options_.now_s();

  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(now);
  auto [it, inserted] = keys_.try_emplace(key);
  KeyState& state = it->second;
  const double request_burst = Burst(options_.key_requests_per_s, options_.key_request_burst);
  const double token_burst = Burst(options_.key_tokens_per_s, options_.key_token_burst);
  if (inserted) {  // a new key starts with full buckets
    state.requests = {.level = request_burst, .last_s = now};
    state.tokens = {.level = token_burst, .last_s = now};
  }
  state.last_seen_s = now;

  // 2. The global bound.
  if (inflight_ + sequences > options_.max_inflight_sequences) {
    return Exhausted(absl::StrCat("the server is running ", inflight_, " sequences of its limit of ",
                                  options_.max_inflight_sequences, " (a request holds n x prompts)"),
                     1);
  }
  // 4. The fair share; a key with nothing in flight always gets its turn.
  if (options_.fair_share && state.inflight > 0) {
    const int64_t active = std::max<int64_t>(1, ActiveKeysLocked(now));
    const int64_t share = std::max<int64_t>(1, options_.max_inflight_sequences / active);
    if (state.inflight + sequences > share) {
      return Exhausted(absl::StrCat("this API key has ", state.inflight, " sequences in flight, its fair share of ",
                                    share, " while ", active, " keys are active"),
                       1);
    }
  }
  // 3. The buckets: both are checked before either is charged.
  if (options_.key_requests_per_s > 0) {
    Refill(state.requests.level, state.requests.last_s, options_.key_requests_per_s, request_burst, now);
    if (state.requests.level < 1) {
      return Exhausted(absl::StrCat("this API key's request rate limit (", options_.key_requests_per_s,
                                    " requests/s) is reached"),
                       SecondsUntil(state.requests.level, 1, options_.key_requests_per_s));
    }
  }
  if (options_.key_tokens_per_s > 0) {
    Refill(state.tokens.level, state.tokens.last_s, options_.key_tokens_per_s, token_burst, now);
    const bool full = state.tokens.level >= token_burst;
    if (state.tokens.level < token_cost && !full) {
      const double need = std::min(token_cost, token_burst);
      return Exhausted(absl::StrCat("this API key's token rate limit (", options_.key_tokens_per_s,
                                    " tokens/s; this request costs ", static_cast<int64_t>(token_cost),
                                    ") is reached"),
                       SecondsUntil(state.tokens.level, need, options_.key_tokens_per_s));
    }
  }
  if (options_.key_requests_per_s > 0) state.requests.level -= 1;
  if (options_.key_tokens_per_s > 0) state.tokens.level -= token_cost;  // may go into debt when it was full
  state.inflight += sequences;
  inflight_ += sequences;
  Ticket ticket;
  ticket.controller_ = this;
  ticket.key_ = key;
  ticket.sequences_ = sequences;
  return ticket;
}

int64_t AdmissionController::inflight_sequences() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inflight_;
}

void AdmissionController::Release(const std::string& key, int64_t sequences) {
  std::lock_guard<std::mutex> lock(mu_);
  inflight_ -= sequences;
  if (auto it = keys_.find(key); it != keys_.end()) it->second.inflight -= sequences;
}

void AdmissionController::ExpireLocked(double now) {
  // At most once per window: the sweep is O(keys).
  if (now - last_expiry_s_ < options_.fairness_window_s) return;
  last_expiry_s_ = now;
  for (auto it = keys_.begin(); it != keys_.end();) {
    const KeyState& s = it->second;
    // A key idle past the window (and past the time its buckets take to refill) with
    // nothing in flight: forgetting it loses nothing but memory.
    double refill_s = 0;
    if (options_.key_requests_per_s > 0) {
      refill_s = std::max(refill_s, (Burst(options_.key_requests_per_s, options_.key_request_burst) -
                                     s.requests.level) / options_.key_requests_per_s);
    }
    if (options_.key_tokens_per_s > 0) {
      refill_s = std::max(refill_s, (Burst(options_.key_tokens_per_s, options_.key_token_burst) - s.tokens.level) /
                                        options_.key_tokens_per_s);
    }
    if (s.inflight == 0 && now - s.last_seen_s > std::max(options_.fairness_window_s, refill_s)) {
      keys_.erase(it++);
    } else {
      ++it;
    }
  }
}

int64_t AdmissionController::ActiveKeysLocked(double now) const {
  int64_t active = 0;
  for (const auto& [key, s] : keys_) {
    if (s.inflight > 0 || now - s.last_seen_s <= options_.fairness_window_s) ++active;
  }
  return active;
}

}  // namespace kvmesh::serving
