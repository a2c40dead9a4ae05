// Family<Metric>: one metric name with its help text, type and label names, and
// its children, one per distinct tuple of label values. Families are created by a
// Registry (which owns them) and live as long as it; so do their children.
// Counter, Gauge and Histogram families are prometheus-cpp families registered in
// the Registry's prometheus::Registry; a CallbackGauge family is kvmesh's own
// (prometheus-cpp has none) and collects itself at scrape time.
//
//   auto* requests = registry.AddCounterFamily("kvmesh_requests", "Requests finished.",
//                                              {"model", "status"}).value();
//   Counter* ok = requests->WithLabels({"tiny-llama", "ok"}).value();   // once, at setup
//   ok->Increment();                                                    // per request: one atomic add
//
// Children are never removed (a cached Metric* must stay valid), so label values
// must come from a bounded set: model names, pool tiers, status codes, never
// request ids.
//
// Thread-safety: thread-safe. WithLabels() takes the family's mutex (a map lookup);
// the returned Metric is used without it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "metrics/callback_gauge.h"
#include "metrics/counter.h"
#include "metrics/gauge.h"
#include "metrics/histogram.h"
#include "prometheus/family.h"
#include "prometheus/metric_family.h"

namespace kvmesh::metrics {

class Registry;

namespace internal {

// What the Registry needs of every family at scrape time.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  // CallbackGauge families: appends this family's samples (nothing when it has none).
  // The others are collected through the prometheus::Registry and do nothing here.
  virtual void CollectOwn(std::vector<prometheus::MetricFamily>* out) const = 0;
  // Puts each sample's labels in label_names() order (prometheus-cpp sorts them by
  // name) and the samples in label-value order, so a scrape reads as it is declared.
  virtual void Normalize(prometheus::MetricFamily* family) const = 0;
};

// Orders label-value tuples lexicographically; transparent, so a lookup by
// span<const string_view> allocates nothing.
struct LabelValuesLess {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }
};

// The prometheus-cpp metric behind each of ours; CallbackGauge has none.
template <typename Metric>
struct PrometheusMetric {
  using type = void;
};
template <>
struct PrometheusMetric<Counter> {
  using type = prometheus::Counter;
};
template <>
struct PrometheusMetric<Gauge> {
  using type = prometheus::Gauge;
};
template <>
struct PrometheusMetric<Histogram> {
  using type = prometheus::Histogram;
};

template <typename Metric>
using PrometheusFamily = std::conditional_t<std::is_same_v<Metric, CallbackGauge>, void,
                                            prometheus::Family<typename PrometheusMetric<Metric>::type>>;

}  // namespace internal

template <typename Metric>
class Family final : public internal::FamilyBase {
 public:
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  // The child for `label_values`, given in label_names() order, created on first
  // use (at zero; a CallbackGauge without a callback). The pointer stays valid and
  // is the same for equal values as long as the Registry lives: cache it.
  // InvalidArgument if the number of values differs from label_names().size() or a
  // value is not valid UTF-8. Any UTF-8 text is a valid value; exposition escapes it.
  absl::StatusOr<Metric*> WithLabels(std::span<const std::string_view> label_values);
  absl::StatusOr<Metric*> WithLabels(std::initializer_list<std::string_view> label_values) {
    return WithLabels(std::span<const std::string_view>(label_values.begin(), label_values.size()));
  }

  // The name in "# TYPE" lines; for a counter it ends in "_total".
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  size_t num_children() const;

  void CollectOwn(std::vector<prometheus::MetricFamily>* out) const override;
  void Normalize(prometheus::MetricFamily* family) const override;

 private:
  friend class Registry;

  // Arguments are validated by the Registry. `impl` is the prometheus-cpp family
  // (owned by the Registry's prometheus::Registry); null for CallbackGauge.
  // `bucket_bounds` only for histograms.
  Family(std::string name, std::string help, std::vector<std::string> label_names, std::vector<double> bucket_bounds,
         internal::PrometheusFamily<Metric>* impl);

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bucket_bounds_;
  internal::PrometheusFamily<Metric>* const impl_;
  // NOTE: std::mutex, not absl::Mutex: Debian's Abseil is not TSan-instrumented.
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Metric>, internal::LabelValuesLess> children_;  // guarded by mu_
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using CallbackGaugeFamily = Family<CallbackGauge>;
using HistogramFamily = Family<Histogram>;

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<CallbackGauge>;
extern template class Family<Histogram>;

}  // namespace kvmesh::metrics
