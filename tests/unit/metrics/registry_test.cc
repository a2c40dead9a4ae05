#include "metrics/registry.h"

#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace kvmesh::metrics {
namespace {

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

TEST(RegistryTest, EmptyRegistryExposesNothing) {
  Registry registry;
  EXPECT_EQ(registry.Exposition(), "");
}

TEST(RegistryTest, CounterGoldenAddsTotalSuffixAndSortsChildren) {
  Registry registry;
  CounterFamily* requests =
      registry.AddCounterFamily("kvmesh_requests", "Requests finished.", {"model", "status"}).value();
  EXPECT_EQ(requests->name(), "kvmesh_requests_total");
  requests->WithLabels({"tiny", "ok"}).value()->Increment(41);
  requests->WithLabels({"big", "ok"}).value()->Increment(2);
  requests->WithLabels({"tiny", "error"}).value()->Increment();
  requests->WithLabels({"tiny", "ok"}).value()->Increment();
  // Given with the suffix: exposed the same way, not as _total_total.
  registry.AddCounter("kvmesh_bytes_sent_total", "Bytes sent.").value()->Increment(1.5);

  EXPECT_EQ(registry.Exposition(),
            "# HELP kvmesh_bytes_sent_total Bytes sent.\n"
            "# TYPE kvmesh_bytes_sent_total counter\n"
            "kvmesh_bytes_sent_total 1.5\n"
            "# HELP kvmesh_requests_total Requests finished.\n"
            "# TYPE kvmesh_requests_total counter\n"
            "kvmesh_requests_total{model=\"big\",status=\"ok\"} 2\n"
            "kvmesh_requests_total{model=\"tiny\",status=\"error\"} 1\n"
            "kvmesh_requests_total{model=\"tiny\",status=\"ok\"} 42\n");
}

TEST(RegistryTest, GaugeGoldenWithEscaping) {
  Registry registry;
  GaugeFamily* family =
      registry.AddGaugeFamily("kvmesh_queue_depth", "Requests \"waiting\" in C:\\queue.\nSecond line.", {"queue"})
          .value();
  family->WithLabels({"a\"b\\c\nd"}).value()->Set(-3.25);
  family->WithLabels({"plain"}).value()->Set(NAN);
  registry.AddGauge("kvmesh_up", "1 when serving.").value()->Set(1);

  EXPECT_EQ(registry.Exposition(),
            "# HELP kvmesh_queue_depth Requests \"waiting\" in C:\\\\queue.\\nSecond line.\n"
            "# TYPE kvmesh_queue_depth gauge\n"
            "kvmesh_queue_depth{queue=\"a\\\"b\\\\c\\nd\"} -3.25\n"
            "kvmesh_queue_depth{queue=\"plain\"} Nan\n"  // prometheus-cpp's spelling; Prometheus reads it
            "# HELP kvmesh_up 1 when serving.\n"
            "# TYPE kvmesh_up gauge\n"
            "kvmesh_up 1\n");
}

TEST(RegistryTest, CallbackGaugeGoldenEvaluatesAtScrapeTime) {
  Registry registry;
  std::atomic<int> used_blocks{10};
  CallbackGaugeFamily* family =
      registry.AddCallbackGaugeFamily("kvmesh_kv_blocks_used", "KV blocks in use.", {"tier"}).value();
  family->WithLabels({"device"}).value()->SetCallback([&used_blocks] { return used_blocks.load(); });
  family->WithLabels({"host"}).value()->SetCallback([] { return 0.5; });
  family->WithLabels({"disk"}).value();  // No callback: no sample.
  registry.AddCallbackGauge("kvmesh_kv_blocks_total", "KV blocks in the pool.", [] { return 4096.0; }).value();
  // A callback gauge family whose only child has no callback writes nothing at all.
  registry.AddCallbackGaugeFamily("kvmesh_unset", "Never set.", {"x"}).value()->WithLabels({"y"}).value();

  const std::string expected_before =
      "# HELP kvmesh_kv_blocks_total KV blocks in the pool.\n"
      "# TYPE kvmesh_kv_blocks_total gauge\n"
      "kvmesh_kv_blocks_total 4096\n"
      "# HELP kvmesh_kv_blocks_used KV blocks in use.\n"
      "# TYPE kvmesh_kv_blocks_used gauge\n"
      "kvmesh_kv_blocks_used{tier=\"device\"} 10\n"
      "kvmesh_kv_blocks_used{tier=\"host\"} 0.5\n";
  EXPECT_EQ(registry.Exposition(), expected_before);
  used_blocks = 17;
  std::string after = expected_before;
  after.replace(after.find("} 10\n"), 5, "} 17\n");
  EXPECT_EQ(registry.Exposition(), after);
}

TEST(RegistryTest, HistogramGoldenHasCumulativeBucketsSumAndCount) {
  Registry registry;
  HistogramFamily* family =
      registry.AddHistogramFamily("kvmesh_ttft_seconds", "Time to first token.", {0.005, 0.1, 1}, {"model"}).value();
  Histogram* tiny = family->WithLabels({"tiny"}).value();
  tiny->Observe(0.001);
  tiny->Observe(0.05);
  tiny->Observe(0.1);
  tiny->Observe(3);
  family->WithLabels({"a \"quoted\" model"}).value();  // Created, never observed: all zero.
  registry.AddHistogram("kvmesh_step_seconds", "Step.", {1, INFINITY}).value()->Observe(2.5e-7);

  EXPECT_EQ(registry.Exposition(),
            // prometheus-cpp writes _count and _sum before the buckets; Prometheus takes any order.
            "# HELP kvmesh_step_seconds Step.\n"
            "# TYPE kvmesh_step_seconds histogram\n"
            "kvmesh_step_seconds_count 1\n"
            "kvmesh_step_seconds_sum 2.5e-07\n"
            "kvmesh_step_seconds_bucket{le=\"1\"} 1\n"
            "kvmesh_step_seconds_bucket{le=\"+Inf\"} 1\n"
            "# HELP kvmesh_ttft_seconds Time to first token.\n"
            "# TYPE kvmesh_ttft_seconds histogram\n"
            "kvmesh_ttft_seconds_count{model=\"a \\\"quoted\\\" model\"} 0\n"
            "kvmesh_ttft_seconds_sum{model=\"a \\\"quoted\\\" model\"} 0\n"
            "kvmesh_ttft_seconds_bucket{model=\"a \\\"quoted\\\" model\",le=\"0.005\"} 0\n"
            "kvmesh_ttft_seconds_bucket{model=\"a \\\"quoted\\\" model\",le=\"0.1\"} 0\n"
            "kvmesh_ttft_seconds_bucket{model=\"a \\\"quoted\\\" model\",le=\"1\"} 0\n"
            "kvmesh_ttft_seconds_bucket{model=\"a \\\"quoted\\\" model\",le=\"+Inf\"} 0\n"
            "kvmesh_ttft_seconds_count{model=\"tiny\"} 4\n"
            "kvmesh_ttft_seconds_sum{model=\"tiny\"} 3.151\n"
            "kvmesh_ttft_seconds_bucket{model=\"tiny\",le=\"0.005\"} 1\n"
            "kvmesh_ttft_seconds_bucket{model=\"tiny\",le=\"0.1\"} 3\n"
            "kvmesh_ttft_seconds_bucket{model=\"tiny\",le=\"1\"} 3\n"
            "kvmesh_ttft_seconds_bucket{model=\"tiny\",le=\"+Inf\"} 4\n");
}

TEST(RegistryTest, FamiliesWithoutChildrenAreLeftOut) {
  Registry registry;
  ASSERT_TRUE(registry.AddCounterFamily("unused", "Unused.", {"a"}).ok());
  EXPECT_EQ(registry.num_families(), 1u);
  EXPECT_EQ(registry.Exposition(), "");
}

TEST(RegistryTest, InvalidMetricNamesAreInvalidArgument) {
  Registry registry;
  EXPECT_EQ(registry.AddCounterFamily("", "h").status().code(), kInvalid);
  EXPECT_EQ(registry.AddCounterFamily("_total", "h").status().code(), kInvalid);
  EXPECT_EQ(registry.AddGaugeFamily("1abc", "h").status().code(), kInvalid);
  EXPECT_EQ(registry.AddGaugeFamily("kvmesh-up", "h").status().code(), kInvalid);
  EXPECT_EQ(registry.AddHistogramFamily("a b", "h", {1}).status().code(), kInvalid);
  EXPECT_EQ(registry.AddCallbackGauge("a.b", "h", [] { return 1.0; }).status().code(), kInvalid);
  EXPECT_EQ(registry.num_families(), 0u);
}

TEST(RegistryTest, InvalidLabelNamesAreInvalidArgument) {
  Registry registry;
  EXPECT_EQ(registry.AddCounterFamily("c1", "h", {"9lives"}).status().code(), kInvalid);
  EXPECT_EQ(registry.AddCounterFamily("c2", "h", {"a:b"}).status().code(), kInvalid);
  EXPECT_EQ(registry.AddCounterFamily("c3", "h", {"__name__"}).status().code(), kInvalid);
  EXPECT_EQ(registry.AddCounterFamily("c4", "h", {"model", "model"}).status().code(), kInvalid);
  EXPECT_EQ(registry.AddGaugeFamily("g1", "h", {""}).status().code(), kInvalid);
  EXPECT_EQ(registry.AddHistogramFamily("h1", "h", {1}, {"le"}).status().code(), kInvalid);
  EXPECT_TRUE(registry.AddGaugeFamily("g2", "h", {"le"}).ok());  // "le" is only reserved in histograms.
  EXPECT_EQ(registry.num_families(), 1u);
}

TEST(RegistryTest, BadHelpAndBucketsAreInvalidArgument) {
  Registry registry;
  EXPECT_EQ(registry.AddGaugeFamily("g", "bad \xC3").status().code(), kInvalid);
  EXPECT_EQ(registry.AddHistogramFamily("h", "h", {2, 1}).status().code(), kInvalid);
  EXPECT_EQ(registry.AddHistogramFamily("h", "h", {1, NAN}).status().code(), kInvalid);
  EXPECT_TRUE(registry.AddHistogramFamily("h", "h", {}).ok());  // Only +Inf.
}

TEST(RegistryTest, DuplicateAndCollidingNamesAreInvalidArgument) {
  Registry registry;
  ASSERT_TRUE(registry.AddCounterFamily("requests", "h").ok());
  EXPECT_EQ(registry.AddCounterFamily("requests", "h").status().code(), kInvalid);
  EXPECT_EQ(registry.AddCounterFamily("requests_total", "h").status().code(), kInvalid);
  EXPECT_EQ(registry.AddGaugeFamily("requests_total", "h").status().code(), kInvalid);
  EXPECT_EQ(registry.AddGaugeFamily("requests", "h").status().code(), kInvalid);

  ASSERT_TRUE(registry.AddHistogramFamily("latency", "h", {1}).ok());
  EXPECT_EQ(registry.AddGaugeFamily("latency_count", "h").status().code(), kInvalid);
  EXPECT_EQ(registry.AddCounterFamily("latency_sum", "h").status().code(), kInvalid);
  EXPECT_EQ(registry.AddCallbackGaugeFamily("latency_bucket", "h").status().code(), kInvalid);

  ASSERT_TRUE(registry.AddGaugeFamily("size_bytes_count", "h").ok());
  EXPECT_EQ(registry.AddHistogramFamily("size_bytes", "h", {1}).status().code(), kInvalid);
  EXPECT_EQ(registry.num_families(), 3u);
}

TEST(RegistryTest, ConcurrentUpdatesScrapesAndRegistrationsAreExact) {
  Registry registry;
  CounterFamily* tokens = registry.AddCounterFamily("tokens", "Tokens.", {"model"}).value();
  HistogramFamily* latency = registry.AddHistogramFamily("latency_seconds", "Latency.", {0.5, 1}, {"model"}).value();
  std::atomic<double> callback_value{0};
  registry.AddCallbackGauge("callback", "Callback.", [&callback_value] { return callback_value.load(); }).value();

  constexpr int kThreads = 6;
  constexpr int kOps = 50000;
  std::atomic<bool> done{false};
  // A scraper and a registrar run alongside the writers: no lock is held across them.
  std::thread scraper([&] {
    while (!done) {
      const std::string text = registry.Exposition();
      EXPECT_EQ(text.back(), '\n');
    }
  });
  std::thread registrar([&] {
    for (int i = 0; i < 200; ++i) registry.AddGauge("extra_" + std::to_string(i), "Extra.").value()->Set(i);
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      const std::string model = t % 2 == 0 ? "even" : "odd";
      Counter* counter = tokens->WithLabels({model}).value();
      Histogram* histogram = latency->WithLabels({model}).value();
      for (int i = 0; i < kOps; ++i) {
        counter->Increment();
        histogram->Observe(i % 2 == 0 ? 0.25 : 0.75);
        callback_value = i;
      }
    });
  }
  for (std::thread& writer : writers) writer.join();
  registrar.join();
  done = true;
  scraper.join();

  const int per_model = kThreads / 2 * kOps;
  const std::string text = registry.Exposition();
  EXPECT_NE(text.find("tokens_total{model=\"even\"} " + std::to_string(per_model) + "\n"), std::string::npos);
  EXPECT_NE(text.find("tokens_total{model=\"odd\"} " + std::to_string(per_model) + "\n"), std::string::npos);
  EXPECT_NE(text.find("latency_seconds_bucket{model=\"odd\",le=\"0.5\"} " + std::to_string(per_model / 2) + "\n"),
            std::string::npos);
  EXPECT_NE(text.find("latency_seconds_count{model=\"odd\"} " + std::to_string(per_model) + "\n"), std::string::npos);
  EXPECT_NE(text.find("latency_seconds_sum{model=\"even\"} " + std::to_string(per_model / 2) + "\n"),
            std::string::npos);  // (0.25 + 0.75) per pair of observations.
  EXPECT_EQ(registry.num_families(), 203u);
}

}  // namespace
}  // namespace kvmesh::metrics
