// Status propagation macros. Debian's Abseil (20220623) ships none, so kvmesh
// defines them once here.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVMESH_STATUS_CONCAT_INNER_(a, b) a##b
#define KVMESH_STATUS_CONCAT_(a, b) KVMESH_STATUS_CONCAT_INNER_(a, b)

// Returns `expr`'s status from the enclosing function when it is not OK.
#define KVMESH_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status kvmesh_status_ = (expr);          \
    if (!kvmesh_status_.ok()) return kvmesh_status_; \
  } while (0)

// `KVMESH_ASSIGN_OR_RETURN(auto x, MakeX());` declares/assigns the value of a
// StatusOr, or returns its status from the enclosing function.
#define KVMESH_ASSIGN_OR_RETURN(lhs, expr) \
  KVMESH_ASSIGN_OR_RETURN_IMPL_(KVMESH_STATUS_CONCAT_(kvmesh_statusor_, __LINE__), lhs, expr)

#define KVMESH_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace kvmesh {

// Abseil 2022 uses its own string_view; these convert without copying.
inline absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view ToStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace kvmesh
