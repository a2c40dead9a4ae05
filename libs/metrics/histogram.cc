#include "metrics/histogram.h"

#include "prometheus/client_metric.h"

namespace kvmesh::metrics {

Histogram::Snapshot Histogram::TakeSnapshot() const {
  const prometheus::ClientMetric collected = impl_.Collect();
  Snapshot snapshot;
  snapshot.bucket_bounds = bounds_;
  snapshot.cumulative_counts.reserve(collected.histogram.bucket.size());
  for (const prometheus::ClientMetric::Bucket& bucket : collected.histogram.bucket) {
    snapshot.cumulative_counts.push_back(bucket.cumulative_count);
  }
  snapshot.sum = collected.histogram.sample_sum;
  snapshot.count = collected.histogram.sample_count;
  return snapshot;
}

}  // namespace kvmesh::metrics
