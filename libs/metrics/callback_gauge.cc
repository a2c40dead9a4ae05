#include "metrics/callback_gauge.h"

#include <utility>

namespace kvmesh::metrics {

void CallbackGauge::SetCallback(std::function<double()> callback) {
  std::function<double()> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = std::exchange(callback_, std::move(callback));
  }
  // `old` (and what it captured) is destroyed here, outside the lock.
}

void CallbackGauge::ClearCallback() { SetCallback(nullptr); }

std::optional<double> CallbackGauge::Evaluate() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!callback_) return std::nullopt;
  return callback_();
}

}  // namespace kvmesh::metrics
