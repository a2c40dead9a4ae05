// Registry: the metric families one service exports on /metrics, and their text
// exposition (Prometheus text format 0.0.4, content type kExpositionContentType).
// Built on prometheus-cpp's core: counters, gauges and histograms are families of a
// prometheus::Registry and a scrape is prometheus::TextSerializer's text; this class
// adds Status-returning validation, callback gauges, cached child handles and a
// deterministic order. Services serve Exposition() from their own HTTP server
// (libs/http), not prometheus-cpp's civetweb exposer.
//
//   metrics::Registry registry;                       // one per service, shared by its threads
//   auto* ttft = registry.AddHistogramFamily("kvmesh_time_to_first_token_seconds", "Time to first token.",
//                                            metrics::TimeToFirstTokenBuckets(), {"model"}).value();
//   metrics::Histogram* tiny_ttft = ttft->WithLabels({"tiny-llama"}).value();  // cache this
//   tiny_ttft->Observe(0.042);                                                 // hot path: lock-free
//   std::string body = registry.Exposition();                                  // GET /metrics
//
// Names. Metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
// [a-zA-Z_][a-zA-Z0-9_]* without a leading "__"; histograms may not use the label
// "le". NOTE (a deliberate choice): a counter's exposed name always ends in
// "_total" and the suffix is added automatically: AddCounterFamily("kvmesh_requests")
// and AddCounterFamily("kvmesh_requests_total") both create the family exposed as
// kvmesh_requests_total (the Prometheus convention; promtool lints counters
// without it). Gauges and histograms are exposed under the name given.
//
// Every name a family writes is reserved: a counter reserves <base> and
// <base>_total, a histogram <name>, <name>_bucket, <name>_sum and <name>_count, a
// gauge <name>. Adding a family whose names collide with reserved ones is an
// InvalidArgument, as is adding the same family twice: families are created once,
// at service start-up, and their pointers handed to the code that updates them.
//
// Exposition order is deterministic: families sorted by exposed name, children
// by label values (bytewise), labels in the order they were declared, histogram
// buckets by increasing bound then +Inf. Families without samples are left out.
// Numbers are written as prometheus-cpp writes them (up to 16 significant digits).
//
// Thread-safety: thread-safe. Families and children live as long as the Registry
// and are never removed; pointers to them may be cached and used from any thread.
// Exposition() holds no Registry or family lock of ours while it reads samples or
// runs CallbackGauge callbacks (prometheus-cpp holds its registry's lock while it
// collects counters, gauges and histograms).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "metrics/family.h"
#include "metrics/text_format.h"
#include "prometheus/registry.h"

namespace kvmesh::metrics {

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Each Add*Family returns a family owned by this Registry. InvalidArgument for an
  // invalid metric or label name, a duplicate label name, help text that is not
  // UTF-8, a name that collides with an existing family (see above), or (histograms)
  // bucket bounds that fail ValidateBucketBounds() or the label name "le".
  absl::StatusOr<CounterFamily*> AddCounterFamily(std::string_view name, std::string_view help,
                                                  std::vector<std::string> label_names = {});
  absl::StatusOr<GaugeFamily*> AddGaugeFamily(std::string_view name, std::string_view help,
                                              std::vector<std::string> label_names = {});
  // Exposed with "# TYPE <name> gauge", like AddGaugeFamily.
  absl::StatusOr<CallbackGaugeFamily*> AddCallbackGaugeFamily(std::string_view name, std::string_view help,
                                                              std::vector<std::string> label_names = {});
  // `bucket_bounds`: finite, strictly increasing upper bounds (see buckets.h); the
  // +Inf bucket is implicit (a trailing +Inf is accepted and dropped).
  absl::StatusOr<HistogramFamily*> AddHistogramFamily(std::string_view name, std::string_view help,
                                                      std::vector<double> bucket_bounds,
                                                      std::vector<std::string> label_names = {});

  // Shorthands for a family without labels and its only child; same errors.
  absl::StatusOr<Counter*> AddCounter(std::string_view name, std::string_view help);
  absl::StatusOr<Gauge*> AddGauge(std::string_view name, std::string_view help);
  absl::StatusOr<Histogram*> AddHistogram(std::string_view name, std::string_view help,
                                          std::vector<double> bucket_bounds);
  // The gauge's callback is set to `callback` (see CallbackGauge for its contract).
  absl::StatusOr<CallbackGauge*> AddCallbackGauge(std::string_view name, std::string_view help,
                                                  std::function<double()> callback);

  // The text of a scrape: for each family with samples, "# HELP", "# TYPE" and one
  // line per sample, each ending in '\n'. Runs the CallbackGauge callbacks.
  std::string Exposition() const;

  size_t num_families() const;

 private:
  // Validates, reserves the family's names and creates it.
  template <typename Metric>
  absl::StatusOr<Family<Metric>*> AddFamily(std::string_view name, std::string_view help,
                                            std::vector<std::string> label_names, std::vector<double> bucket_bounds);

  // NOTE: std::mutex, not absl::Mutex: Debian's Abseil is not TSan-instrumented.
  mutable std::mutex mu_;
  // Owns the prometheus-cpp families behind Counter, Gauge and Histogram families.
  const std::unique_ptr<prometheus::Registry> prometheus_;
  // Keyed by exposed name: iteration order is exposition order.
  std::map<std::string, std::unique_ptr<internal::FamilyBase>, std::less<>> families_;  // guarded by mu_
  absl::flat_hash_set<std::string> reserved_names_;                                     // guarded by mu_
};

}  // namespace kvmesh::metrics
