#include "worker/worker_health.h"

#include "gtest/gtest.h"

namespace kvmesh::worker {
namespace {

TEST(WorkerHealthTest, NotReadyUntilRegistered) {
  WorkerHealth health(/*needs_registration=*/true);
  EXPECT_EQ(health.Health().status_code, 503);
  EXPECT_EQ(health.Health().body, R"({"status":"registering"})");
  EXPECT_EQ(health.Live().status_code, 200);
  health.SetRegistered();
  EXPECT_EQ(health.Health().status_code, 200);
  EXPECT_EQ(health.Health().body, R"({"status":"ok"})");
}

TEST(WorkerHealthTest, WithoutSchedulerReadyAtOnce) {
  WorkerHealth health(/*needs_registration=*/false);
  EXPECT_EQ(health.Health().status_code, 200);
}

TEST(WorkerHealthTest, DrainingFailsHealthButNotLiveness) {
  WorkerHealth health(/*needs_registration=*/true);
  health.SetRegistered();
  health.SetDraining();
  EXPECT_EQ(health.Health().status_code, 503);
  EXPECT_EQ(health.Health().body, R"({"status":"draining"})");
  EXPECT_EQ(health.Live().status_code, 200);
}

TEST(WorkerHealthTest, DrainingBeforeRegistrationSaysDraining) {
  WorkerHealth health(/*needs_registration=*/true);
  health.SetDraining();
  EXPECT_EQ(health.Health().body, R"({"status":"draining"})");
}

}  // namespace
}  // namespace kvmesh::worker
