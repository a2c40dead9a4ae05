#include "metrics/family.h"

#include <optional>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "metrics/text_format.h"
#include "prometheus/client_metric.h"
#include "prometheus/labels.h"

namespace kvmesh::metrics {

template <typename Metric>
Family<Metric>::Family(std::string name, std::string help, std::vector<std::string> label_names,
                       std::vector<double> bucket_bounds, internal::PrometheusFamily<Metric>* impl)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      bucket_bounds_(std::move(bucket_bounds)),
      impl_(impl) {}

template <typename Metric>
absl::StatusOr<Metric*> Family<Metric>::WithLabels(std::span<const std::string_view> label_values) {
  if (label_values.size() != label_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("metric ", name_, " has ", label_names_.size(), " label(s) but ",
                                                   label_values.size(), " value(s) were given"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = children_.find(label_values); it != children_.end()) return it->second.get();

  // A new child: validate here, once, so prometheus-cpp never sees a bad value.
  prometheus::Labels labels;
  for (size_t i = 0; i < label_values.size(); ++i) {
    if (!IsValidUtf8(label_values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", name_, ": value of label ", label_names_[i], " is not valid UTF-8"));
    }
    labels.emplace(label_names_[i], std::string(label_values[i]));
  }
  std::unique_ptr<Metric> metric;
  if constexpr (std::is_same_v<Metric, CallbackGauge>) {
    metric = std::make_unique<Metric>();
  } else if constexpr (std::is_same_v<Metric, Histogram>) {
    metric.reset(new Metric(impl_->Add(labels, bucket_bounds_), bucket_bounds_));  // Private constructor; friend.
  } else {
    metric.reset(new Metric(impl_->Add(labels)));
  }
  Metric* result = metric.get();
  children_.emplace(std::vector<std::string>(label_values.begin(), label_values.end()), std::move(metric));
  return result;
}

template <typename Metric>
size_t Family<Metric>::num_children() const {
  std::lock_guard<std::mutex> lock(mu_);
  return children_.size();
}

template <typename Metric>
void Family<Metric>::CollectOwn(std::vector<prometheus::MetricFamily>* out) const {
  if constexpr (std::is_same_v<Metric, CallbackGauge>) {
    // Children are never removed and map nodes never move, so the pointers stay valid
    // after the lock is dropped. NOTE: no lock is held while callbacks run, so a
    // callback may call into the registry without deadlock.
    std::vector<std::pair<const std::vector<std::string>*, const CallbackGauge*>> children;
    {
      std::lock_guard<std::mutex> lock(mu_);
      children.reserve(children_.size());
      for (const auto& [values, child] : children_) children.emplace_back(&values, child.get());
    }
    prometheus::MetricFamily family{name_, help_, prometheus::MetricType::Gauge, {}};
    for (const auto& [values, gauge] : children) {
      const std::optional<double> value = gauge->Evaluate();
      if (!value) continue;
      prometheus::ClientMetric& metric = family.metric.emplace_back();
      metric.label.reserve(values->size());
      for (size_t i = 0; i < values->size(); ++i) metric.label.push_back({label_names_[i], (*values)[i]});
      metric.gauge.value = *value;
    }
    if (!family.metric.empty()) out->push_back(std::move(family));  // No sample: no HELP/TYPE either.
  }
}

template <typename Metric>
void Family<Metric>::Normalize(prometheus::MetricFamily* family) const {
  if (label_names_.empty()) return;  // One sample at most.
  // prometheus-cpp keeps children in a hash map and labels in a std::map.
  for (prometheus::ClientMetric& metric : family->metric) {
    if (label_names_.size() < 2) break;
    std::vector<prometheus::ClientMetric::Label> ordered;
    ordered.reserve(metric.label.size());
    for (const std::string& name : label_names_) {
      for (prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == name) ordered.push_back(std::move(label));
      }
    }
    metric.label = std::move(ordered);
  }
  std::sort(family->metric.begin(), family->metric.end(),
            [](const prometheus::ClientMetric& a, const prometheus::ClientMetric& b) {
              return std::lexicographical_compare(
                  a.label.begin(), a.label.end(), b.label.begin(), b.label.end(),
                  [](const auto& x, const auto& y) { return x.value < y.value; });
            });
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<CallbackGauge>;
template class Family<Histogram>;

}  // namespace kvmesh::metrics
