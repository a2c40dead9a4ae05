// The exposition must be accepted by Prometheus' own parser and linter:
// `promtool check metrics` exits 0 and prints nothing when both are satisfied.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "metrics/buckets.h"
#include "metrics/registry.h"

namespace kvmesh::metrics {
namespace {

// The promtool binary, or "" when it is not installed.
std::string FindPromtool() {
  if (const char* env = std::getenv("PROMTOOL"); env != nullptr && *env != '\0') return env;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "";
  dirs += ":/usr/bin:/usr/local/bin";
  size_t begin = 0;
  while (begin <= dirs.size()) {
    size_t end = dirs.find(':', begin);
    if (end == std::string::npos) end = dirs.size();
    const std::string candidate = dirs.substr(begin, end - begin) + "/promtool";
    if (end > begin && access(candidate.c_str(), X_OK) == 0) return candidate;
    begin = end + 1;
  }
  return "";
}

// A registry with every metric type, labels, escaping and many buckets.
void Populate(Registry& registry) {
  CounterFamily* requests =
      registry
          .AddCounterFamily("kvmesh_requests", "Requests finished, by \"model\" and status.\nC:\\ path.",
                            {"model", "status"})
          .value();
  requests->WithLabels({"tiny-llama", "ok"}).value()->Increment(12345);
  requests->WithLabels({"weird \"model\"\\name\nline two caf\xC3\xA9", "error"}).value()->Increment();
  registry.AddCounter("kvmesh_generated_tokens_total", "Tokens generated.").value()->Increment(2.5);

  GaugeFamily* running = registry.AddGaugeFamily("kvmesh_running_requests", "Requests running.", {"model"}).value();
  running->WithLabels({"tiny-llama"}).value()->Set(3);
  running->WithLabels({""}).value()->Set(-0.125);
  registry.AddGauge("kvmesh_temperature_celsius", "A NaN gauge.").value()->Set(NAN);
  registry.AddGauge("kvmesh_huge_ratio", "An infinite gauge.").value()->Set(INFINITY);

  CallbackGaugeFamily* blocks =
      registry.AddCallbackGaugeFamily("kvmesh_kv_blocks_used", "KV blocks in use.", {"tier"}).value();
  blocks->WithLabels({"device"}).value()->SetCallback([] { return 1024.0; });
  blocks->WithLabels({"host"}).value()->SetCallback([] { return 1e-9; });
  registry.AddCallbackGauge("kvmesh_kv_blocks", "KV blocks in the pool.", [] { return 4096.0; }).value();

  HistogramFamily* ttft = registry
                              .AddHistogramFamily("kvmesh_time_to_first_token_seconds", "Time to first token.",
                                                  TimeToFirstTokenBuckets(), {"model"})
                              .value();
  HistogramFamily* itl = registry
                             .AddHistogramFamily("kvmesh_inter_token_latency_seconds", "Inter-token latency.",
                                                 InterTokenLatencyBuckets(), {"model"})
                             .value();
  HistogramFamily* e2e = registry
                             .AddHistogramFamily("kvmesh_request_latency_seconds", "End-to-end latency.",
                                                 EndToEndLatencyBuckets(), {"model"})
                             .value();
  HistogramFamily* sizes = registry
                               .AddHistogramFamily("kvmesh_transfer_size_bytes", "Transfer sizes.",
                                                   ExponentialBuckets(1, 2, 48).value(), {"peer", "direction"})
                               .value();
  for (const char* model : {"tiny-llama", "a \"quoted\" \\ model"}) {
    for (int i = 0; i < 1000; ++i) {
      ttft->WithLabels({model}).value()->Observe(0.0001 * i * i);
      itl->WithLabels({model}).value()->Observe(0.00003 * i);
      e2e->WithLabels({model}).value()->Observe(0.01 * i);
    }
  }
  sizes->WithLabels({"10.0.0.1:5000", "send"}).value()->Observe(1 << 20);
  sizes->WithLabels({"10.0.0.1:5000", "recv"}).value()->Observe(1e15);
  registry.AddHistogram("kvmesh_negative_values", "Negative bounds.", LinearBuckets(-10, 0.5, 41).value())
      .value()
      ->Observe(-3);
}

TEST(PromtoolTest, CheckMetricsAcceptsTheExposition) {
  const std::string promtool = FindPromtool();
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool not found (Debian package `prometheus`; tools/setup installs it)";
  }
  Registry registry;
  Populate(registry);
  const std::string text = registry.Exposition();

  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("kvmesh_metrics_promtool_" + std::to_string(getpid()) + ".txt");
  {
    std::ofstream out(file, std::ios::binary);
    out << text;
    ASSERT_TRUE(out.good());
  }
  const std::string command = "'" + promtool + "' check metrics < '" + file.string() + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr) << command;
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  std::filesystem::remove(file);

  ASSERT_TRUE(WIFEXITED(status)) << command;
  EXPECT_EQ(WEXITSTATUS(status), 0) << output << "\n--- exposition ---\n" << text;
  EXPECT_EQ(output, "") << "\n--- exposition ---\n" << text;
  // It exercised what it claims to.
  EXPECT_NE(text.find("# TYPE kvmesh_kv_blocks_used gauge"), std::string::npos);
  EXPECT_NE(text.find("le=\"+Inf\""), std::string::npos);
  EXPECT_NE(text.find("\\\""), std::string::npos);
  EXPECT_NE(text.find("\\n"), std::string::npos);
  EXPECT_NE(text.find("\\\\"), std::string::npos);
}

}  // namespace
}  // namespace kvmesh::metrics
