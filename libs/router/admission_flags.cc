#include "router/admission_flags.h"

#include "absl/flags/flag.h"
#include "core/flag_checks.h"

ABSL_FLAG(int32_t, max_prompts_per_request, 256, "Prompts one /v1/completions request may batch (400 beyond).");
KVMESH_FLAG_RANGE(max_prompts_per_request, 1, 1000000);
ABSL_FLAG(int64_t, max_prompt_tokens_per_request, 1 << 20, "Prompt tokens of one request, summed over its prompts.");
KVMESH_FLAG_RANGE(max_prompt_tokens_per_request, 1, int64_t{1} << 40);
ABSL_FLAG(int32_t, max_stop_strings, 16, "Stop strings one request may give.");
KVMESH_FLAG_RANGE(max_stop_strings, 0, 1024);
ABSL_FLAG(int32_t, max_stop_string_bytes, 256, "Bytes of one stop string.");
KVMESH_FLAG_RANGE(max_stop_string_bytes, 1, 1 << 20);
ABSL_FLAG(double, key_requests_per_s, 0,
          "Per API key: requests per second (token bucket; 429 + Retry-After beyond); 0: unlimited.");
KVMESH_FLAG_RANGE(key_requests_per_s, 0, 1e9);
ABSL_FLAG(double, key_request_burst, 0, "Per API key: requests above the rate a burst may take (0: one second's).");
KVMESH_FLAG_RANGE(key_request_burst, 0, 1e9);
ABSL_FLAG(double, key_tokens_per_s, 0,
          "Per API key: tokens per second, a request costing its prompt tokens + n x prompts x max_tokens; 0: unlimited.");
KVMESH_FLAG_RANGE(key_tokens_per_s, 0, 1e12);
ABSL_FLAG(double, key_token_burst, 0, "Per API key: the token bucket's size (0: one second's).");
KVMESH_FLAG_RANGE(key_token_burst, 0, 1e12);
ABSL_FLAG(bool, fair_share, true,
          "Cap each API key's sequences in flight at the capacity / keys active in the last 10 s (429 beyond).");

namespace kvmesh::router {

serving::AdmissionOptions AdmissionOptionsFromFlags(int32_t max_inflight_sequences) {
  serving::AdmissionOptions o;
  o.max_inflight_sequences = max_inflight_sequences;
  o.max_prompts_per_request = absl::GetFlag(FLAGS_max_prompts_per_request);
  o.max_prompt_tokens_per_request = absl::GetFlag(FLAGS_max_prompt_tokens_per_request);
  o.max_stop_strings = absl::GetFlag(FLAGS_max_stop_strings);
  o.max_stop_string_bytes = absl::GetFlag(FLAGS_max_stop_string_bytes);
  o.key_requests_per_s = absl::GetFlag(FLAGS_key_requests_per_s);
  o.key_request_burst = absl::GetFlag(FLAGS_key_request_burst);
  o.key_tokens_per_s = absl::GetFlag(FLAGS_key_tokens_per_s);
  o.key_token_burst = absl::GetFlag(FLAGS_key_token_burst);
  o.fair_share = absl::GetFlag(FLAGS_fair_share);
  return o;
}

}  // namespace kvmesh::router
