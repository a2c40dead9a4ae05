#include "metrics/family.h"

#include <optional>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "metrics/text_format.h"

namespace kvmesh::metrics {
namespace {

template <typename Metric>
constexpr std::string_view TypeName() {
  if constexpr (std::is_same_v<Metric, Counter>) {
    return "counter";
  } else if constexpr (std::is_same_v<Metric, Histogram>) {
    return "histogram";
  } else {
    return "gauge";  // Gauge and CallbackGauge.
  }
}

std::vector<std::string> LeTexts(const std::vector<double>& bounds) {
  std::vector<std::string> texts;
  texts.reserve(bounds.size() + 1);
  for (double bound : bounds) {
    std::string text;
    AppendDouble(bound, &text);
    texts.push_back(std::move(text));
  }
  texts.push_back("+Inf");
  return texts;
}

// Appends `name{labels} value\n`; `labels` is pre-escaped and may be empty.
void AppendSample(std::string_view name, std::string_view suffix, std::string_view labels, double value,
                  std::string* out) {
  out->append(name);
  out->append(suffix);
  if (!labels.empty()) {
    out->push_back('{');
    out->append(labels);
    out->push_back('}');
  }
  out->push_back(' ');
  AppendDouble(value, out);
  out->push_back('\n');
}

}  // namespace

template <typename Metric>
Family<Metric>::Family(std::string name, std::string help, std::vector<std::string> label_names,
                       std::vector<double> bucket_bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      bucket_bounds_(std::move(bucket_bounds)),
      le_texts_(std::is_same_v<Metric, Histogram> ? LeTexts(bucket_bounds_) : std::vector<std::string>{}) {}

template <typename Metric>
absl::StatusOr<Metric*> Family<Metric>::WithLabels(std::span<const std::string_view> label_values) {
  if (label_values.size() != label_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("metric ", name_, " has ", label_names_.size(), " label(s) but ",
                                                   label_values.size(), " value(s) were given"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = children_.find(label_values); it != children_.end()) return it->second.metric.get();

  // A new child: validate and render its labels once, here, not on every scrape.
  Child child;
  for (size_t i = 0; i < label_values.size(); ++i) {
    if (!IsValidUtf8(label_values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", name_, ": value of label ", label_names_[i], " is not valid UTF-8"));
    }
    if (i > 0) child.labels_text.push_back(',');
    child.labels_text.append(label_names_[i]);
    child.labels_text.append("=\"");
    AppendEscapedLabelValue(label_values[i], &child.labels_text);
    child.labels_text.push_back('"');
  }
  if constexpr (std::is_same_v<Metric, Histogram>) {
    child.metric.reset(new Metric(bucket_bounds_));  // Private constructor; this family is its friend.
  } else {
    child.metric = std::make_unique<Metric>();
  }
  Metric* metric = child.metric.get();
  children_.emplace(std::vector<std::string>(label_values.begin(), label_values.end()), std::move(child));
  return metric;
}

template <typename Metric>
size_t Family<Metric>::num_children() const {
  std::lock_guard<std::mutex> lock(mu_);
  return children_.size();
}

template <typename Metric>
void Family<Metric>::AppendExposition(std::string* out) const {
  // Children are never removed and map nodes never move, so the pointers stay valid
  // after the lock is dropped. NOTE: no lock is held while samples are read, so a
  // callback may call into the registry without deadlock.
  std::vector<const Child*> children;
  {
    std::lock_guard<std::mutex> lock(mu_);
    children.reserve(children_.size());
    for (const auto& [values, child] : children_) children.push_back(&child);
  }
  if (children.empty()) return;

  const size_t start = out->size();
  out->append("# HELP ").append(name_).push_back(' ');
  AppendEscapedHelp(help_, out);
  out->append("\n# TYPE ").append(name_).push_back(' ');
  out->append(TypeName<Metric>()).push_back('\n');
  const size_t header_end = out->size();

  for (const Child* child : children) {
    const std::string& labels = child->labels_text;
    if constexpr (std::is_same_v<Metric, Counter> || std::is_same_v<Metric, Gauge>) {
      AppendSample(name_, "", labels, child->metric->Value(), out);
    } else if constexpr (std::is_same_v<Metric, CallbackGauge>) {
      if (std::optional<double> value = child->metric->Evaluate()) AppendSample(name_, "", labels, *value, out);
    } else {
      const Histogram::Snapshot snapshot = child->metric->TakeSnapshot();
      for (size_t i = 0; i < snapshot.cumulative_counts.size(); ++i) {
        out->append(name_).append("_bucket{");
        if (!labels.empty()) out->append(labels).push_back(',');
        out->append("le=\"").append(le_texts_[i]).append("\"} ");
        AppendDouble(static_cast<double>(snapshot.cumulative_counts[i]), out);
        out->push_back('\n');
      }
      AppendSample(name_, "_sum", labels, snapshot.sum, out);
      AppendSample(name_, "_count", labels, static_cast<double>(snapshot.count), out);
    }
  }
  if (out->size() == header_end) out->resize(start);  // No sample: no HELP/TYPE either.
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<CallbackGauge>;
template class Family<Histogram>;

}  // namespace kvmesh::metrics
