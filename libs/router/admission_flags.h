// The admission flags of every front door (`kvmesh serve`, `kvmesh router`,
// kvmesh-router): request limits, per-API-key rate limits and fair share
// (serving/admission_controller.h), defined once here. --help lists this file as
// "admission_flags".
#pragma once

#include <cstdint>

#include "serving/admission_controller.h"

namespace kvmesh::router {

inline constexpr char kAdmissionFlagsFile[] = "admission_flags";

// The options the flags ask for, with `max_inflight_sequences` (--max-inflight-requests,
// which counts n x prompts sequences).
serving::AdmissionOptions AdmissionOptionsFromFlags(int32_t max_inflight_sequences);

}  // namespace kvmesh::router
