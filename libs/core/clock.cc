#include "core/clock.h"

namespace kvmesh {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

Clock& Clock::Real() {
  static RealClock* clock = new RealClock();  // NOTE: leaked on purpose (no destruction order issue)
  return *clock;
}

}  // namespace kvmesh
