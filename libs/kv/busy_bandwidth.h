// BusyBandwidth: how fast a resource moves data while it is working — units moved
// (bytes, or tokens for prefill) over its busy seconds, where busy is the wall time
// with at least one transfer in flight. It is the one estimate of a tier's read and
// write bandwidth (kv/kv_tier_stats.h): the load-or-recompute decision (kv/kv_tiers.h)
// and every printed or exported figure read the same number.
//
// Why busy time: transfers overlap (a disk tier keeps hundreds of reads in flight), so
// one transfer's bytes over its own latency undercounts the device by the queue depth;
// and they come in bursts, so bytes over wall time since start counts idle gaps as
// slowness. A per-batch or per-window average weights a two-read batch like a
// two-hundred-read one (the earlier estimates did, and printed 11.6 GB/s for a disk
// that reads 0.9); summing bytes and busy seconds weights every byte once.
//
// Busy time is the measure of the union of the transfers' [start, end] intervals. Ends
// may be reported late and out of order (an I/O completes on a reaper thread and the
// engine reaps it a step later): a region of time is final once every transfer still
// in flight started after it, and only then is it counted; until then completed
// intervals wait, merged, in `pending_`.
//
// Decay (optional): with half_life_seconds > 0, what was measured half_life busy
// seconds ago weighs half as much as what is measured now, so the estimate follows a
// device whose speed changes (contention, a different context length for prefill).
// With 0 it is cumulative: bytes moved / busy seconds since construction.
//
// Time is never read here: callers pass the time points (the transfers' own stamps,
// or a fake clock's in tests), so the estimator is deterministic and testable.
//
// Thread-safety: not thread-safe; owned by one thread (the tier's owner).
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <vector>

namespace kvmesh::kv {

// Half-life the tiers and the engine use: a few seconds of busy time, so one run of a
// benchmark reads as nearly cumulative and a long-running worker still adapts.
inline constexpr double kDefaultBandwidthHalfLifeSeconds = 8.0;

struct BusyBandwidthOptions {
  // Busy seconds after which a measurement weighs half; 0: never forget (cumulative).
  double half_life_seconds = 0;
};

class BusyBandwidth {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  explicit BusyBandwidth(BusyBandwidthOptions options = {}) : options_(options) {}

  // Overlapping transfers (I/O): Begin when one is submitted; End when it completed,
  // with the same `start`, when it ended (its own completion stamp, in any order
  // relative to other Ends) and the units it moved (0 for a failed one: its time still
  // counts, it was the device's). Every Begin needs exactly one End.
  void Begin(TimePoint start);
  void End(TimePoint start, TimePoint end, int64_t units);
  // Ends the transfer begun at `start` without measuring it: its time does not count
  // (but for what other transfers overlapped). For a transfer whose time was not the
  // resource's: a remote peer that died, hung or restarted under it.
  void Forget(TimePoint start);
  // A transfer that ran by itself for `seconds` (a synchronous copy timed by its caller;
  // never mix with Begin/End on one estimator): busy for exactly that long.
  void Add(int64_t units, double seconds);

  // Units per busy second; 0 until a transfer with a positive duration completed.
  double units_per_second() const;
  int32_t in_flight() const { return static_cast<int32_t>(starts_.size()); }
  // Undecayed totals since construction (for tests and counters).
  int64_t total_units() const { return total_units_; }
  double total_busy_seconds() const { return total_busy_seconds_ + PendingSeconds(); }

 private:
  struct Interval {
    TimePoint start;
    TimePoint end;
  };
  // Counts `seconds` of final busy time (decaying what was there before) and `units`.
  void Fold(double seconds, int64_t units);
  // Moves every part of `pending_` before the earliest start still in flight into the totals.
  void FoldFinal();
  double PendingSeconds() const;

  const BusyBandwidthOptions options_;
  std::multiset<TimePoint> starts_;  // transfers in flight, by start
  std::vector<Interval> pending_;    // completed, not yet final: disjoint, sorted by start
  int64_t pending_units_ = 0;        // units reported since the last fold
  // Decayed sums (equal to the totals without decay).
  double units_ = 0;
  double busy_seconds_ = 0;
  int64_t total_units_ = 0;
  double total_busy_seconds_ = 0;  // final busy time only
};

}  // namespace kvmesh::kv
