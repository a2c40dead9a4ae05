#include "cluster_rpc/cluster_conversions.h"

#include <gtest/gtest.h>

namespace kvmesh::cluster_rpc {
namespace {

TEST(SchedulerConversionsTest, WorkerLoadRoundTripsWithMeasuredSpeeds) {
  const cluster::WorkerLoad load{.num_running_seqs = 3,
                                 .num_waiting_seqs = 2,
                                 .kv_blocks_total = 100,
                                 .kv_blocks_used = 40,
                                 .kv_blocks_free = 60,
                                 .kv_blocks_cached = 10,
                                 .queue_depth = 1,
                                 .kv_host_read_bytes_per_second = 12.5e9,
                                 .kv_disk_read_bytes_per_second = 1.5e9,
                                 .prefill_tokens_per_second = 4321.0};
  v1::WorkerLoad proto;
  WorkerLoadToProto(load, &proto);
  EXPECT_DOUBLE_EQ(proto.kv_disk_read_bytes_per_second(), 1.5e9);
  const cluster::WorkerLoad back = WorkerLoadFromProto(proto);
  EXPECT_EQ(back.kv_blocks_cached, 10);
  EXPECT_DOUBLE_EQ(back.kv_host_read_bytes_per_second, 12.5e9);
  EXPECT_DOUBLE_EQ(back.kv_disk_read_bytes_per_second, 1.5e9);
  EXPECT_DOUBLE_EQ(back.prefill_tokens_per_second, 4321.0);
}

TEST(SchedulerConversionsTest, UnmeasuredSpeedsAreZero) {
  const cluster::WorkerLoad back = WorkerLoadFromProto(v1::WorkerLoad{});
  EXPECT_EQ(back.kv_host_read_bytes_per_second, 0);
  EXPECT_EQ(back.prefill_tokens_per_second, 0);
}

}  // namespace
}  // namespace kvmesh::cluster_rpc
