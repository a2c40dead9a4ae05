#include "metrics/registry.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "metrics/buckets.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace kvmesh::metrics {
namespace {

constexpr std::string_view kCounterSuffix = "_total";

}  // namespace

Registry::Registry() : prometheus_(std::make_unique<prometheus::Registry>()) {}
Registry::~Registry() = default;

template <typename Metric>
absl::StatusOr<Family<Metric>*> Registry::AddFamily(std::string_view name, std::string_view help,
                                                    std::vector<std::string> label_names,
                                                    std::vector<double> bucket_bounds) {
  constexpr bool kIsCounter = std::is_same_v<Metric, Counter>;
  constexpr bool kIsHistogram = std::is_same_v<Metric, Histogram>;

  // 1. Names: the exposed name and every sample name the family will write.
  KVMESH_RETURN_IF_ERROR(ValidateMetricName(name));
  std::string exposed_name;
  std::vector<std::string> reserved;
  if constexpr (kIsCounter) {
    std::string_view base = name;
    if (base.ends_with(kCounterSuffix)) base.remove_suffix(kCounterSuffix.size());
    if (!IsValidMetricName(base)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid counter name \"", ToAbsl(name), "\": nothing before the _total suffix"));
    }
    exposed_name = absl::StrCat(ToAbsl(base), ToAbsl(kCounterSuffix));
    reserved = {std::string(base), exposed_name};
  } else if constexpr (kIsHistogram) {
    exposed_name = std::string(name);
    reserved = {exposed_name, exposed_name + "_bucket", exposed_name + "_sum", exposed_name + "_count"};
  } else {
    exposed_name = std::string(name);
    reserved = {exposed_name};
  }

  // 2. Help text and label names.
  if (!IsValidUtf8(help)) {
    return absl::InvalidArgumentError(absl::StrCat("help text of metric ", exposed_name, " is not valid UTF-8"));
  }
  absl::flat_hash_set<std::string_view> seen_labels;
  for (const std::string& label : label_names) {
    KVMESH_RETURN_IF_ERROR(ValidateLabelName(label));
    if (!seen_labels.insert(label).second) {
      return absl::InvalidArgumentError(absl::StrCat("metric ", exposed_name, " lists label ", label, " twice"));
    }
    if (kIsHistogram && label == "le") {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram ", exposed_name, " may not use the label \"le\": it names the buckets"));
    }
  }

  // 3. Buckets.
  if constexpr (kIsHistogram) {
    if (absl::Status status = ValidateBucketBounds(bucket_bounds); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("histogram ", exposed_name, ": ", status.message()));
    }
    if (!bucket_bounds.empty() && std::isinf(bucket_bounds.back())) bucket_bounds.pop_back();
  }

  // 4. Reserve the names, then create.
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& sample_name : reserved) {
    if (reserved_names_.contains(sample_name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric ", exposed_name, " collides with an existing family: ", sample_name, " is already taken"));
    }
  }
  for (std::string& sample_name : reserved) reserved_names_.insert(std::move(sample_name));
  // NOTE: prometheus-cpp throws on names it rejects; every name was validated above.
  // It writes help text verbatim, so it gets the text escaped as the format wants.
  std::string escaped_help;
  AppendEscapedHelp(help, &escaped_help);
  internal::PrometheusFamily<Metric>* impl = nullptr;
  if constexpr (std::is_same_v<Metric, Counter>) {
    impl = &prometheus::BuildCounter().Name(exposed_name).Help(escaped_help).Register(*prometheus_);
  } else if constexpr (std::is_same_v<Metric, Gauge>) {
    impl = &prometheus::BuildGauge().Name(exposed_name).Help(escaped_help).Register(*prometheus_);
  } else if constexpr (kIsHistogram) {
    impl = &prometheus::BuildHistogram().Name(exposed_name).Help(escaped_help).Register(*prometheus_);
  }
  std::unique_ptr<Family<Metric>> family(
      new Family<Metric>(exposed_name, std::string(help), std::move(label_names), std::move(bucket_bounds), impl));
  Family<Metric>* result = family.get();
  families_.emplace(std::move(exposed_name), std::move(family));
  return result;
}

absl::StatusOr<CounterFamily*> Registry::AddCounterFamily(std::string_view name, std::string_view help,
                                                          std::vector<std::string> label_names) {
  return AddFamily<Counter>(name, help, std::move(label_names), {});
}

absl::StatusOr<GaugeFamily*> Registry::AddGaugeFamily(std::string_view name, std::string_view help,
                                                      std::vector<std::string> label_names) {
  return AddFamily<Gauge>(name, help, std::move(label_names), {});
}

absl::StatusOr<CallbackGaugeFamily*> Registry::AddCallbackGaugeFamily(std::string_view name, std::string_view help,
                                                                      std::vector<std::string> label_names) {
  return AddFamily<CallbackGauge>(name, help, std::move(label_names), {});
}

absl::StatusOr<HistogramFamily*> Registry::AddHistogramFamily(std::string_view name, std::string_view help,
                                                              std::vector<double> bucket_bounds,
                                                              std::vector<std::string> label_names) {
  return AddFamily<Histogram>(name, help, std::move(label_names), std::move(bucket_bounds));
}

absl::StatusOr<Counter*> Registry::AddCounter(std::string_view name, std::string_view help) {
  KVMESH_ASSIGN_OR_RETURN(CounterFamily * family, AddCounterFamily(name, help));
  return family->WithLabels({});
}

absl::StatusOr<Gauge*> Registry::AddGauge(std::string_view name, std::string_view help) {
  KVMESH_ASSIGN_OR_RETURN(GaugeFamily * family, AddGaugeFamily(name, help));
  return family->WithLabels({});
}

absl::StatusOr<Histogram*> Registry::AddHistogram(std::string_view name, std::string_view help,
                                                  std::vector<double> bucket_bounds) {
  KVMESH_ASSIGN_OR_RETURN(HistogramFamily * family, AddHistogramFamily(name, help, std::move(bucket_bounds)));
  return family->WithLabels({});
}

absl::StatusOr<CallbackGauge*> Registry::AddCallbackGauge(std::string_view name, std::string_view help,
                                                          std::function<double()> callback) {
  KVMESH_ASSIGN_OR_RETURN(CallbackGaugeFamily * family, AddCallbackGaugeFamily(name, help));
  KVMESH_ASSIGN_OR_RETURN(CallbackGauge * gauge, family->WithLabels({}));
  gauge->SetCallback(std::move(callback));
  return gauge;
}

std::string Registry::Exposition() const {
  // Families are never removed: collect them after dropping mu_, so callbacks and
  // slow scrapes never block Add*Family. Names are the map's keys: stable too.
  std::vector<std::pair<std::string_view, const internal::FamilyBase*>> families;
  {
    std::lock_guard<std::mutex> lock(mu_);
    families.reserve(families_.size());
    for (const auto& [name, family] : families_) families.emplace_back(name, family.get());
  }
  std::vector<prometheus::MetricFamily> collected = prometheus_->Collect();
  for (prometheus::MetricFamily& family : collected) {
    const auto it = std::lower_bound(families.begin(), families.end(), family.name,
                                     [](const auto& entry, const std::string& name) { return entry.first < name; });
    if (it != families.end() && it->first == family.name) it->second->Normalize(&family);
  }
  // NOTE: prometheus-cpp has no callback gauge; ours are collected here, at scrape
  // time, so the value's owner stays its only copy and nothing is paid between scrapes.
  for (const auto& [name, family] : families) family->CollectOwn(&collected);
  std::sort(collected.begin(), collected.end(),
            [](const prometheus::MetricFamily& a, const prometheus::MetricFamily& b) { return a.name < b.name; });
  return prometheus::TextSerializer().Serialize(collected);
}

size_t Registry::num_families() const {
  std::lock_guard<std::mutex> lock(mu_);
  return families_.size();
}

}  // namespace kvmesh::metrics
