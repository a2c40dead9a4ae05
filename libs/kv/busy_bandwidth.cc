#include "kv/busy_bandwidth.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace kvmesh::kv {
namespace {

double Seconds(BusyBandwidth::TimePoint a, BusyBandwidth::TimePoint b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

void BusyBandwidth::Begin(TimePoint start) { starts_.insert(start); }

void BusyBandwidth::End(TimePoint start, TimePoint end, int64_t units) {
  if (const auto it = starts_.find(start); it != starts_.end()) starts_.erase(it);
  end = std::max(end, start);
  // Insert [start, end] into the sorted, disjoint pending list, merging what it touches.
  Interval merged{.start = start, .end = end};
  std::vector<Interval> next;
  next.reserve(pending_.size() + 1);
  bool placed = false;
  for (const Interval& iv : pending_) {
    if (iv.end < merged.start) {
      next.push_back(iv);
    } else if (merged.end < iv.start) {
      if (!placed) {
        next.push_back(merged);
        placed = true;
      }
      next.push_back(iv);
    } else {
      merged.start = std::min(merged.start, iv.start);
      merged.end = std::max(merged.end, iv.end);
    }
  }
  if (!placed) next.push_back(merged);
  pending_ = std::move(next);
  pending_units_ += units;
  total_units_ += units;
  FoldFinal();
}

void BusyBandwidth::Forget(TimePoint start) {
  if (const auto it = starts_.find(start); it != starts_.end()) starts_.erase(it);
  FoldFinal();
}

void BusyBandwidth::Add(int64_t units, double seconds) {
  if (seconds <= 0) return;
  Fold(seconds, units);
  total_busy_seconds_ += seconds;
  total_units_ += units;
}

void BusyBandwidth::Fold(double seconds, int64_t units) {
  if (options_.half_life_seconds > 0 && seconds > 0) {
    const double keep = std::exp2(-seconds / options_.half_life_seconds);
    units_ *= keep;
    busy_seconds_ *= keep;
  }
  busy_seconds_ += seconds;
  units_ += static_cast<double>(units);
}

void BusyBandwidth::FoldFinal() {
  // Time before the earliest start still in flight is final: no transfer in flight
  // covers it, and any later Begin starts now, after every end already reported.
  const bool idle = starts_.empty();
  const TimePoint horizon = idle ? TimePoint::max() : *starts_.begin();
  double seconds = 0;
  size_t done = 0;
  for (; done < pending_.size(); ++done) {
    Interval& iv = pending_[done];
    if (iv.end <= horizon) {
      seconds += Seconds(iv.start, iv.end);
      continue;
    }
    if (iv.start < horizon) {
      seconds += Seconds(iv.start, horizon);
      iv.start = horizon;
    }
    break;
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
  if (seconds <= 0) return;
  // NOTE: the units reported since the last fold join with this time, after its decay:
  // units whose time is still pending count as final a little early, which only shifts
  // their weight, where decaying them with their own time would bias the estimate low.
  Fold(seconds, pending_units_);
  pending_units_ = 0;
  total_busy_seconds_ += seconds;
}

double BusyBandwidth::PendingSeconds() const {
  double seconds = 0;
  for (const Interval& iv : pending_) seconds += Seconds(iv.start, iv.end);
  return seconds;
}

double BusyBandwidth::units_per_second() const {
  const double seconds = busy_seconds_ + PendingSeconds();
  return seconds > 0 ? (units_ + static_cast<double>(pending_units_)) / seconds : 0;
}

}  // namespace kvmesh::kv
