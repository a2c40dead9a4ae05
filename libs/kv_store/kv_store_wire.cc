#include "kv_store/kv_store_wire.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvmesh::kv_store {

v1::KvPutIntentResponse::Outcome ToProto(IntentOutcome outcome) {
  switch (outcome) {
    case IntentOutcome::kReserved:
      return v1::KvPutIntentResponse::OUTCOME_RESERVED;
    case IntentOutcome::kPresent:
      return v1::KvPutIntentResponse::OUTCOME_PRESENT;
    case IntentOutcome::kBusy:
      return v1::KvPutIntentResponse::OUTCOME_BUSY;
    case IntentOutcome::kNoSpace:
      return v1::KvPutIntentResponse::OUTCOME_NO_SPACE;
  }
  return v1::KvPutIntentResponse::OUTCOME_UNSPECIFIED;
}

absl::Status CheckKeyCount(int n, std::string_view field) {
  if (n >= 1 && n <= kMaxKeysPerRequest) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(ToAbsl(field), ": ", n, " keys; a request names 1 to ", kMaxKeysPerRequest));
}

}  // namespace kvmesh::kv_store
