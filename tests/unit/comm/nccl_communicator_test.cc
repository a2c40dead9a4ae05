// NCCL collectives on the GPUs of this machine: ranks are threads, one per GPU, or
// all on GPU 0 where there is only one (NCCL may refuse that; the test then says so).
#include "comm/nccl_communicator.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "comm/tcp_store_client.h"
#include "comm/tcp_store_server.h"
#include "gtest/gtest.h"

#ifdef KVMESH_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace kvmesh::comm {
namespace {

#ifndef KVMESH_HAVE_NCCL
TEST(NcclCommunicatorTest, UnimplementedWithoutNccl) {
  auto server = TcpStoreServer::Start({}).value();
  auto store = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
  EXPECT_EQ(CreateNcclCommunicator({}, *store).status().code(), absl::StatusCode::kUnimplemented);
}
#else

// Ranks 0..n-1 as threads; returns each rank's status and the all-reduced values.
struct RankResult {
  absl::Status status;
  std::vector<float> sum;
  std::vector<float> gathered;
  std::vector<float> replayed;  // queued: the sum after a captured all-reduce replayed twice
};

// queued: each rank's collectives go on a stream of its own (NcclCommunicatorOptions::
// queue), as a GPU rank's backend stream, and complete through AwaitQueue; then one
// all-reduce is captured into a CUDA graph and the graph replayed twice.
std::vector<RankResult> RunAllReduceAndGather(int n, int devices, bool queued = false) {
  auto server = TcpStoreServer::Start({}).value();
  std::vector<RankResult> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      RankResult& out = results[r];
      auto store = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
      cudaSetDevice(r % devices);
      cudaStream_t stream = nullptr;
      if (queued) cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      auto comm = CreateNcclCommunicator(
          {.rank = r, .world_size = n, .device = r % devices, .timeout = absl::Seconds(20), .queue = stream}, *store);
      if (!comm.ok()) {
        out.status = comm.status();
        return;
      }
      EXPECT_EQ((*comm)->queue(), static_cast<void*>(stream));
      const int64_t count = 4096;
      float* d = nullptr;
      float* g = nullptr;
      cudaMalloc(&d, count * sizeof(float));
      cudaMalloc(&g, n * count * sizeof(float));
      std::vector<float> host(count);
      for (int64_t i = 0; i < count; ++i) host[i] = static_cast<float>(r + i);
      cudaMemcpy(d, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
      out.status = (*comm)->AllGather(d, g, count, DType::kF32);
      if (out.status.ok()) out.status = (*comm)->AllReduceSum(d, count, DType::kF32);
      if (out.status.ok()) out.status = (*comm)->Barrier();
      if (out.status.ok()) out.status = (*comm)->AwaitQueue(nullptr);
      out.sum.resize(count);
      out.gathered.resize(n * count);
      cudaMemcpy(out.sum.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost);
      cudaMemcpy(out.gathered.data(), g, n * count * sizeof(float), cudaMemcpyDeviceToHost);
      if (queued && out.status.ok()) {
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        out.status = (*comm)->AllReduceSum(d, count, DType::kF32);
        EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
        EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        for (int replay = 0; replay < 2 && out.status.ok(); ++replay) {
          EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        }
        if (out.status.ok()) out.status = (*comm)->AwaitQueue(nullptr);
        out.replayed.resize(count);
        cudaMemcpy(out.replayed.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost);
        if (exec != nullptr) cudaGraphExecDestroy(exec);
        if (graph != nullptr) cudaGraphDestroy(graph);
      }
      cudaFree(d);
      cudaFree(g);
      comm->reset();  // before its stream goes
      if (stream != nullptr) cudaStreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

void ExpectCorrect(const std::vector<RankResult>& results) {
  const int n = static_cast<int>(results.size());
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
    for (int64_t i = 0; i < 4096; i += 511) {
      const float sum = static_cast<float>(n * (n - 1) / 2 + n * i);
      EXPECT_EQ(results[r].sum[i], sum);
      for (int p = 0; p < n; ++p) EXPECT_EQ(results[r].gathered[p * 4096 + i], static_cast<float>(p + i));
      // Two replays of an all-reduce of equal values multiply them by n each.
      if (!results[r].replayed.empty()) {
        EXPECT_EQ(results[r].replayed[i], sum * static_cast<float>(n * n));
      }
    }
  }
}

TEST(NcclCommunicatorTest, SingleRankGroupOnGpu) {
  if (NumCudaDevices() == 0) GTEST_SKIP() << "no CUDA device (or no driver): the NCCL path runs on GPU machines";
  ExpectCorrect(RunAllReduceAndGather(1, 1));
}

TEST(NcclCommunicatorTest, TwoRanksOnDistinctGpusOrBothOnOne) {
  const int devices = NumCudaDevices();
  if (devices == 0) GTEST_SKIP() << "no CUDA device (or no driver): the NCCL path runs on GPU machines";
  auto results = RunAllReduceAndGather(2, devices);
  if (devices == 1 && (!results[0].status.ok() || !results[1].status.ok())) {
    // NCCL rejects two ranks of one communicator on the same GPU (ncclInvalidUsage,
    // "Duplicate GPU detected"); say so rather than fail.
    GTEST_SKIP() << "NCCL refused 2 ranks on the one GPU: rank 0: " << results[0].status
                 << "; rank 1: " << results[1].status;
  }
  ExpectCorrect(results);
}

TEST(NcclCommunicatorTest, QueuedOnACallersStreamAndCapturedIntoAGraph) {
  const int devices = NumCudaDevices();
  if (devices == 0) GTEST_SKIP() << "no CUDA device (or no driver): the NCCL path runs on GPU machines";
  // Two ranks where two GPUs are, else one (NCCL refuses two on one GPU).
  ExpectCorrect(RunAllReduceAndGather(std::min(devices, 2), devices, /*queued=*/true));
}

TEST(NcclCommunicatorTest, MissingPeerTimesOutInsteadOfHanging) {
  if (NumCudaDevices() == 0) GTEST_SKIP() << "no CUDA device (or no driver): the NCCL path runs on GPU machines";
  auto server = TcpStoreServer::Start({}).value();
  auto store = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
  const absl::Time start = absl::Now();
  // Rank 1 of 2 waits for rank 0's id, which never comes.
  auto comm = CreateNcclCommunicator({.rank = 1, .world_size = 2, .timeout = absl::Seconds(1)}, *store);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}
#endif

}  // namespace
}  // namespace kvmesh::comm
