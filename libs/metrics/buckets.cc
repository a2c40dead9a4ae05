#include "metrics/buckets.h"

#include <cmath>
#include <cstddef>

#include "absl/strings/str_cat.h"

namespace kvmesh::metrics {

absl::Status ValidateBucketBounds(const std::vector<double>& bounds) {
  size_t n = bounds.size();
  if (n > 0 && bounds[n - 1] == INFINITY) --n;  // The implicit +Inf bucket, written out.
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(bounds[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram bucket bound ", i, " is ", bounds[i], ": bounds must be finite"));
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("histogram bucket bounds must be strictly increasing: bound ", i,
                                                     " (", bounds[i], ") <= bound ", i - 1, " (", bounds[i - 1], ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ExponentialBuckets needs start > 0, factor > 1, count >= 1; got ",
                                                   start, ", ", factor, ", ", count));
  }
  std::vector<double> bounds;
  bounds.reserve(count);
  double bound = start;
  for (int i = 0; i < count; ++i) {
    bounds.push_back(bound);
    bound *= factor;
  }
  if (!std::isfinite(bounds.back())) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExponentialBuckets(", start, ", ", factor, ", ", count, ") overflows to infinity"));
  }
  return bounds;
}

absl::StatusOr<std::vector<double>> LinearBuckets(double start, double width, int count) {
  if (!std::isfinite(start) || !(width > 0) || count < 1) {
    return absl::InvalidArgumentError(absl::StrCat("LinearBuckets needs a finite start, width > 0, count >= 1; got ",
                                                   start, ", ", width, ", ", count));
  }
  std::vector<double> bounds;
  bounds.reserve(count);
  for (int i = 0; i < count; ++i) bounds.push_back(start + i * width);
  if (!std::isfinite(bounds.back())) {
    return absl::InvalidArgumentError(
        absl::StrCat("LinearBuckets(", start, ", ", width, ", ", count, ") overflows to infinity"));
  }
  // NOTE: a width tiny relative to start can round two bounds to the same value.
  if (absl::Status status = ValidateBucketBounds(bounds); !status.ok()) return status;
  return bounds;
}

std::vector<double> TimeToFirstTokenBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}

std::vector<double> InterTokenLatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
          0.1,   0.15,   0.2,   0.3,    0.4,  0.5,   0.75, 1.0,   2.5,  5.0,  7.5,  10.0};
}

std::vector<double> EndToEndLatencyBuckets() {
  return {0.01, 0.025, 0.05, 0.1,  0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,   5.0,
          10.0, 15.0,  20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0};
}

}  // namespace kvmesh::metrics
