// metrics_bench: cost of the libs/metrics hot path (Counter::Increment,
// Histogram::Observe, Gauge) single-threaded and with two threads contending on
// the same child (and on two different children, for reference), plus the cost of
// one scrape (Registry::Exposition) of a service-sized registry. Counters, gauges and
// histograms are prometheus-cpp's (libs/metrics is a thin layer over its core), so
// these are prometheus-cpp's costs plus the layer's.
//
//   ./build/tests/bench/metrics_bench [iterations_per_thread]
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "metrics/buckets.h"
#include "metrics/registry.h"

namespace kvmesh::metrics {
namespace {

using Clock = std::chrono::steady_clock;

// Runs op(thread_index, i) for i in [0, iterations) on `threads` threads started
// together; returns wall-clock ns per operation per thread.
template <typename Op>
double NsPerOp(int threads, int64_t iterations, const Op& op) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      for (int64_t i = 0; i < iterations; ++i) op(t, i);
    });
  }
  while (ready.load() < threads) {
  }
  const Clock::time_point start = Clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& worker : workers) worker.join();
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  return ns / static_cast<double>(iterations);
}

void Report(const char* name, double single, double contended, double separate) {
  std::printf("%-40s %10.2f %16.2f %18.2f\n", name, single, contended, separate);
}

int Main(int argc, char** argv) {
  const int64_t iterations = argc > 1 ? std::atoll(argv[1]) : 20'000'000;
  Registry registry;
  CounterFamily* counters = registry.AddCounterFamily("bench_ops", "Ops.", {"thread"}).value();
  Counter* shared_counter = counters->WithLabels({"shared"}).value();
  Counter* own_counters[2] = {counters->WithLabels({"0"}).value(), counters->WithLabels({"1"}).value()};
  GaugeFamily* gauges = registry.AddGaugeFamily("bench_level", "Level.", {"thread"}).value();
  Gauge* shared_gauge = gauges->WithLabels({"shared"}).value();
  Gauge* own_gauges[2] = {gauges->WithLabels({"0"}).value(), gauges->WithLabels({"1"}).value()};
  HistogramFamily* ttft =
      registry.AddHistogramFamily("bench_ttft_seconds", "TTFT.", TimeToFirstTokenBuckets(), {"thread"}).value();
  Histogram* shared_ttft = ttft->WithLabels({"shared"}).value();
  Histogram* own_ttft[2] = {ttft->WithLabels({"0"}).value(), ttft->WithLabels({"1"}).value()};
  HistogramFamily* small = registry
                               .AddHistogramFamily("bench_small_seconds", "Few buckets.",
                                                   ExponentialBuckets(0.001, 4, 8).value(), {"thread"})
                               .value();
  Histogram* shared_small = small->WithLabels({"shared"}).value();
  Histogram* own_small[2] = {small->WithLabels({"0"}).value(), small->WithLabels({"1"}).value()};

  // Log-uniform latencies over 100 us .. 100 s: the bucket changes from call to call.
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> exponent(-4, 2);
  std::vector<double> values(4096);
  for (double& v : values) v = std::pow(10.0, exponent(rng));
  const auto value = [&values](int t, int64_t i) { return values[(i + t * 1013) & 4095]; };

  std::printf("metrics_bench: %lld iterations per thread; ns per operation per thread (wall)\n",
              static_cast<long long>(iterations));
  std::printf("%-40s %10s %16s %18s\n", "operation", "1 thread", "2 threads, same", "2 threads, own");
  Report("Counter::Increment()", NsPerOp(1, iterations, [&](int, int64_t) { shared_counter->Increment(); }),
         NsPerOp(2, iterations, [&](int, int64_t) { shared_counter->Increment(); }),
         NsPerOp(2, iterations, [&](int t, int64_t) { own_counters[t]->Increment(); }));
  Report("Counter::Increment(double)", NsPerOp(1, iterations, [&](int, int64_t) { shared_counter->Increment(0.5); }),
         NsPerOp(2, iterations, [&](int, int64_t) { shared_counter->Increment(0.5); }),
         NsPerOp(2, iterations, [&](int t, int64_t) { own_counters[t]->Increment(0.5); }));
  Report("Gauge::Set", NsPerOp(1, iterations, [&](int, int64_t i) { shared_gauge->Set(static_cast<double>(i)); }),
         NsPerOp(2, iterations, [&](int, int64_t i) { shared_gauge->Set(static_cast<double>(i)); }),
         NsPerOp(2, iterations, [&](int t, int64_t i) { own_gauges[t]->Set(static_cast<double>(i)); }));
  Report("Gauge::Increment", NsPerOp(1, iterations, [&](int, int64_t) { shared_gauge->Increment(); }),
         NsPerOp(2, iterations, [&](int, int64_t) { shared_gauge->Increment(); }),
         NsPerOp(2, iterations, [&](int t, int64_t) { own_gauges[t]->Increment(); }));
  Report("Histogram::Observe, 19 bkts, random v",
         NsPerOp(1, iterations, [&](int t, int64_t i) { shared_ttft->Observe(value(t, i)); }),
         NsPerOp(2, iterations, [&](int t, int64_t i) { shared_ttft->Observe(value(t, i)); }),
         NsPerOp(2, iterations, [&](int t, int64_t i) { own_ttft[t]->Observe(value(t, i)); }));
  Report("Histogram::Observe, 19 bkts, fixed v",
         NsPerOp(1, iterations, [&](int, int64_t) { shared_ttft->Observe(0.042); }),
         NsPerOp(2, iterations, [&](int, int64_t) { shared_ttft->Observe(0.042); }),
         NsPerOp(2, iterations, [&](int t, int64_t) { own_ttft[t]->Observe(0.042); }));
  Report("Histogram::Observe, 8 bkts, random v",
         NsPerOp(1, iterations, [&](int t, int64_t i) { shared_small->Observe(value(t, i)); }),
         NsPerOp(2, iterations, [&](int t, int64_t i) { shared_small->Observe(value(t, i)); }),
         NsPerOp(2, iterations, [&](int t, int64_t i) { own_small[t]->Observe(value(t, i)); }));

  // One scrape of a service-sized registry: 8 models x (3 latency histograms + 4 counters + 3 gauges).
  Registry service;
  HistogramFamily* hists[3] = {
      service.AddHistogramFamily("kvmesh_ttft_seconds", "TTFT.", TimeToFirstTokenBuckets(), {"model"}).value(),
      service.AddHistogramFamily("kvmesh_itl_seconds", "ITL.", InterTokenLatencyBuckets(), {"model"}).value(),
      service.AddHistogramFamily("kvmesh_e2e_seconds", "E2E.", EndToEndLatencyBuckets(), {"model"}).value()};
  CounterFamily* ctrs[4];
  GaugeFamily* ggs[3];
  for (int k = 0; k < 4; ++k) {
    ctrs[k] = service.AddCounterFamily("kvmesh_counter_" + std::to_string(k), "C.", {"model"}).value();
  }
  for (int k = 0; k < 3; ++k) {
    ggs[k] = service.AddGaugeFamily("kvmesh_gauge_" + std::to_string(k), "G.", {"model"}).value();
  }
  for (int m = 0; m < 8; ++m) {
    const std::string model = "model-" + std::to_string(m);
    for (HistogramFamily* h : hists) h->WithLabels({model}).value()->Observe(0.1 * m);
    for (CounterFamily* c : ctrs) c->WithLabels({model}).value()->Increment(m * 1000);
    for (GaugeFamily* g : ggs) g->WithLabels({model}).value()->Set(m);
  }
  constexpr int kScrapes = 2000;
  size_t bytes = 0;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < kScrapes; ++i) bytes += service.Exposition().size();
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / kScrapes;
  std::printf("Registry::Exposition, %d families x 8 models: %.1f us per scrape, %zu bytes\n", 10, us,
              bytes / kScrapes);
  return 0;
}

}  // namespace
}  // namespace kvmesh::metrics

int main(int argc, char** argv) { return kvmesh::metrics::Main(argc, argv); }
