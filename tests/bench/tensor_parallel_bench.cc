// tensor_parallel_bench: what tensor parallelism costs on CPU ranks (threads on
// loopback Gloo, libs/comm + engine/TensorParallelRunner).
//   1. The all-reduce alone: median time of GlooCommunicator::AllReduceSum at 2 ranks
//      for the sizes one decode step reduces ([batch, hidden] f32) and a large one.
//   2. One decode step of the default model at TP=1 and TP=2: median step time for a
//      batch of sequences with a cached context, and for TP=2 the communication share:
//      rank 0's seconds inside collectives (waiting for the slower rank included) per
//      step / step time.
// NOTE: on a 2-core machine both ranks share the cores (each gets total_threads / N
// kernel threads), so TP is for correctness here, not speed.
//
// Usage: tensor_parallel_bench [--model DIR] [--threads N] [--quick]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_timer.h"
#include "comm/gloo_communicator.h"
#include "comm/tcp_store_client.h"
#include "comm/tcp_store_server.h"
#include "engine/paged_model_runner.h"
#include "engine/tensor_parallel_runner.h"

namespace kvmesh {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kContext = 128;  // cached tokens per sequence before the timed decode step

// Median seconds of one all-reduce of `count` floats between `n` rank threads.
double AllReduceSeconds(int n, int64_t count, bool quick) {
  auto server = comm::TcpStoreServer::Start({}).value();
  std::vector<double> medians(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto store = comm::TcpStoreClient::Connect(server->address(), absl::Seconds(10)).value();
      auto c = comm::GlooCommunicator::Create({.rank = r, .world_size = n}, *store).value();
      std::vector<float> data(count, 1.0f);
      // Every rank runs the same number of iterations (the timer's loop is data-independent
      // only with a fixed count), so use a fixed count rather than a time budget.
      const int runs = quick ? 20 : 200;
      medians[r] = bench::MedianSeconds([&] { (void)c->AllReduceSum(data.data(), count, DType::kF32); }, runs, 0.0,
                                        runs);
    });
  }
  for (auto& t : threads) t.join();
  return medians[0];
}

engine::ModelBatch Prefill(int32_t batch, int32_t vocab) {
  engine::ModelBatch b;
  for (int32_t s = 0; s < batch; ++s) {
    engine::SequenceChunk c;
    for (int32_t i = 0; i < kContext; ++i) c.token_ids.push_back((s * 131 + i * 7) % vocab);
    for (int32_t k = 0; k <= kContext / kBlockSize; ++k) c.block_table.push_back(s * (kContext / kBlockSize + 1) + k);
    b.chunks.push_back(std::move(c));
  }
  return b;
}

engine::ModelBatch Decode(const engine::ModelBatch& prefill, int32_t vocab) {
  engine::ModelBatch b;
  for (const engine::SequenceChunk& p : prefill.chunks) {
    engine::SequenceChunk c;
    c.start_position = kContext;
    c.token_ids = {static_cast<int32_t>(p.block_table[0] * 17 % vocab)};
    c.block_table = p.block_table;
    c.compute_logits = true;
    b.chunks.push_back(std::move(c));
  }
  return b;
}

// Median seconds of one decode step (re-running the same step: same positions, same slots).
double DecodeStepSeconds(engine::ModelRunner& runner, int32_t batch, bool quick) {
  const engine::ModelBatch prefill = Prefill(batch, runner.vocab_size());
  if (!runner.Execute(prefill).ok()) std::abort();
  const engine::ModelBatch decode = Decode(prefill, runner.vocab_size());
  return bench::MedianSeconds(
      [&] {
        if (!runner.Execute(decode).ok()) std::abort();
      },
      quick ? 5 : 15, quick ? 0.2 : 1.0, 200);
}

}  // namespace
}  // namespace kvmesh

int main(int argc, char** argv) {
  using namespace kvmesh;
  std::string model_dir = KVMESH_TINY_MODEL_DIR;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      model_dir = argv[++i];
    } else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: %s [--model DIR] [--threads N] [--quick]\n", argv[0]);
      return 2;
    }
  }
  auto backend = backend::CreateCpuBackend({.num_threads = threads}).value();
  auto model = engine::LlamaModel::Load(model_dir, *backend).value();
  const int64_t hidden = model->config().hidden_size;
  const std::vector<int32_t> batches = quick ? std::vector<int32_t>{1, 8} : std::vector<int32_t>{1, 8, 32};

  std::printf("all-reduce alone (Gloo, 2 rank threads on loopback), median\n");
  for (int64_t count : {hidden, 8 * hidden, 32 * hidden, int64_t{1} << 18}) {
    const double s = AllReduceSeconds(2, count, quick);
    std::printf("  %8lld floats (%7.1f KiB)  %8.1f us  %7.2f GB/s algorithm bandwidth\n", static_cast<long long>(count),
                count * 4 / 1024.0, s * 1e6, count * 4 / s / 1e9);
  }

  std::printf("\none decode step, %s, context %d tokens per sequence, %d kernel threads in all, median\n",
              model_dir.c_str(), kContext, threads);
  auto single = engine::PagedModelRunner::Create(*model, {.block_size_tokens = kBlockSize, .num_blocks = 512}).value();
  std::vector<double> tp1(batches.size());
  for (size_t i = 0; i < batches.size(); ++i) {
    tp1[i] = DecodeStepSeconds(*single, batches[i], quick);
    std::printf("  TP=1 batch %3d  %9.2f ms\n", batches[i], tp1[i] * 1e3);
  }
  single.reset();
  auto tp = engine::TensorParallelRunner::Create(
      model_dir, {.tensor_parallel_size = 2, .block_size_tokens = kBlockSize, .num_blocks = 512, .total_threads = threads});
  if (!tp.ok()) {
    std::fprintf(stderr, "TP=2: %s\n", std::string(tp.status().message()).c_str());
    return 1;
  }
  for (size_t i = 0; i < batches.size(); ++i) {
    const engine::ModelBatch prefill = Prefill(batches[i], (*tp)->vocab_size());
    if (!(*tp)->Execute(prefill).ok()) return 1;
    const engine::ModelBatch decode = Decode(prefill, (*tp)->vocab_size());
    // Communication share over a fixed number of steps (the median is of the same steps).
    const int steps = quick ? 5 : 20;
    std::vector<double> times;
    double comm_seconds = 0, total_seconds = 0;
    for (int k = 0; k < steps + 1; ++k) {
      const double comm_before = (*tp)->communication_seconds(0);
      const auto start = std::chrono::steady_clock::now();
      if (!(*tp)->Execute(decode).ok()) return 1;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (k == 0) continue;  // warm-up
      times.push_back(s);
      total_seconds += s;
      comm_seconds += (*tp)->communication_seconds(0) - comm_before;
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    std::printf("  TP=2 batch %3d  %9.2f ms  (%.2fx TP=1)  communication %.1f%% of step time (%.2f ms per step)\n",
                batches[i], median * 1e3, median / tp1[i], 100.0 * comm_seconds / total_seconds,
                comm_seconds / steps * 1e3);
  }
  return 0;
}
