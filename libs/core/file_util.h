// Small file helpers that report errors as absl::Status naming the path.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace kvmesh {

// The whole file; NotFound if it does not exist, PermissionDenied/Internal on read errors.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
// Writes atomically (temp file + rename).
absl::Status WriteStringToFile(const std::string& path, const std::string& contents);
bool FileExists(const std::string& path);
// "a/b" + "c" -> "a/b/c".
std::string JoinPath(const std::string& dir, const std::string& name);

}  // namespace kvmesh
