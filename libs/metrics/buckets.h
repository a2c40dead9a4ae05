// Histogram bucket upper bounds: generic helpers and kvmesh's latency buckets.
//
// A histogram's bounds are finite and strictly increasing; the implicit last
// bucket, le="+Inf", is always added by Histogram and must not be listed (a
// trailing +Inf is accepted and dropped).
//
// Thread-safety: stateless free functions; thread-safe.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvmesh::metrics {

// OK when `bounds` (optionally ending in +Inf) are finite and strictly increasing;
// InvalidArgument naming the first bad position otherwise. An empty list is valid:
// the histogram then has only the +Inf bucket.
absl::Status ValidateBucketBounds(const std::vector<double>& bounds);

// {start, start*factor, start*factor^2, ...}, `count` bounds. InvalidArgument unless
// start > 0, factor > 1, count >= 1 and every bound is finite.
absl::StatusOr<std::vector<double>> ExponentialBuckets(double start, double factor, int count);

// {start, start+width, start+2*width, ...}, `count` bounds (each computed as
// start + i*width, so no error accumulates). InvalidArgument unless width > 0,
// count >= 1 and every bound is finite.
absl::StatusOr<std::vector<double>> LinearBuckets(double start, double width, int count);

// Seconds from a request's arrival to its first output token (queueing + prefill):
// 1 ms ... 80 s, as vLLM's vllm:time_to_first_token_seconds.
std::vector<double> TimeToFirstTokenBuckets();

// Seconds between consecutive output tokens of one sequence (one decode step as
// the sequence sees it): 1 ms ... 10 s, finer than vLLM's below 10 ms because a
// CPU or small-model decode step lives there.
std::vector<double> InterTokenLatencyBuckets();

// Seconds from a request's arrival to its last output token: 10 ms ... 1920 s.
std::vector<double> EndToEndLatencyBuckets();

}  // namespace kvmesh::metrics
