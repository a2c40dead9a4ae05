#include "kv/disk_kv_tier.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <list>
#include <system_error>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/logging.h"
#include "kv/busy_bandwidth.h"
#include "kv/checksum.h"

namespace kvmesh::kv {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x31304b5344564b4bULL;  // "KKVDSK01" little-endian
constexpr int64_t kSlabFileMaxBytes = int64_t{1} << 30;

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// The fixed part of a record header; the rest of its 4 KiB is zero.
struct RecordHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t salt;
  uint64_t hash_low, hash_high;
  uint64_t parent_low, parent_high;
  int32_t dtype;
  int32_t num_layers;
  int64_t block_bytes;
  int64_t payload_bytes;
  uint64_t payload_checksum;
  uint64_t sequence;  // write order, for the LRU order and duplicates after a restart
  uint64_t header_checksum;  // XXH3-64 of every byte above
};
static_assert(sizeof(RecordHeader) == 104);
constexpr size_t kChecksummedHeaderBytes = offsetof(RecordHeader, header_checksum);

uint64_t HeaderChecksum(const RecordHeader& h) {
  return Checksum({reinterpret_cast<const std::byte*>(&h), kChecksummedHeaderBytes});
}

// A 4 KiB-aligned heap buffer (O_DIRECT needs aligned memory).
struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte, AlignedFree>;
AlignedBuffer AllocateAligned(int64_t bytes) {
  void* p = std::aligned_alloc(kDiskRecordAlignment, static_cast<size_t>(RoundUp(bytes, kDiskRecordAlignment)));
  if (p != nullptr) std::memset(p, 0, static_cast<size_t>(bytes));
  return AlignedBuffer(static_cast<std::byte*>(p));
}

bool IsAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kDiskRecordAlignment == 0; }

// A disk-full condition: the write fails with ResourceExhausted and the tier stops
// growing its files. A short write means the same (RLIMIT_FSIZE writes up to the limit).
bool IsDiskFull(int err) { return err == ENOSPC || err == EFBIG || err == EDQUOT; }

}  // namespace

int64_t DiskRecordBytes(int64_t record_payload_bytes) {
  return kDiskRecordAlignment + RoundUp(record_payload_bytes, kDiskRecordAlignment);
}

class DiskKvTier::Impl {
 public:
  enum class SlotState : uint8_t { kFree, kWriting, kHeld, kDropping };
  struct Slot {
    SlotState state = SlotState::kFree;
    BlockHash hash;
    BlockHash parent;
    uint64_t checksum = 0;
    int32_t pins = 0;            // reads in flight
    bool allocated = false;      // its bytes exist on disk: overwriting needs no new space
    bool header_maybe_valid = false;  // a verifying header may sit there: zero it before reuse
    std::list<int32_t>::iterator lru;
  };
  enum class OpKind : uint8_t { kWrite, kRead, kInvalidate };
  struct Op {
    OpKind kind = OpKind::kWrite;
    int32_t slot = -1;
    BlockHash hash;
    int32_t pending_cqes = 0;
    int first_error = 0;     // errno of the first failed (not cancelled) SQE
    bool short_io = false;
    AlignedBuffer staging;   // bounce buffer when the caller's memory is not aligned
    AlignedBuffer header;    // the write's header
    std::span<std::byte> read_dst;
    Clock::time_point start;
    std::array<uint32_t, 3> lens{};  // bytes each linked SQE asked for
  };

  explicit Impl(const DiskKvTierOptions& o) : options_(o) {}
  ~Impl() {
    if (ring_ready_) {
      Drain();
      StopReaper();
      io_uring_queue_exit(&ring_);
    }
    for (int fd : fds_) ::close(fd);
  }

  absl::Status Init();
  bool Lookup(const BlockHash& hash) {
    ++stats_.queries;
    const bool hit = Contains(hash);
    if (hit) ++stats_.hits;
    return hit;
  }
  bool Contains(const BlockHash& hash) const {
    auto it = index_.find(hash);
    return it != index_.end() && slots_[it->second].state == SlotState::kHeld;
  }
  absl::StatusOr<int64_t> StartWrite(const BlockHash& hash, const BlockHash& parent,
                                     std::span<const std::byte> payload, uint64_t checksum);
  absl::StatusOr<int64_t> StartRead(const BlockHash& hash, std::span<std::byte> dst);
  std::vector<KvIoCompletion> Poll() { return Reap(/*wait=*/false); }
  std::vector<KvIoCompletion> Drain() { return Reap(/*wait=*/true); }
  std::vector<KvEvent> DrainEvents() { return std::exchange(events_, {}); }
  int64_t num_records() const { return static_cast<int64_t>(lru_.size()); }
  int64_t capacity_records() const { return static_cast<int64_t>(slots_.size()); }
  int32_t num_in_flight() const { return user_ops_in_flight_; }
  // NOTE: writes are capped at half the queue: with write-through traffic saturating
  // it, a read (a request waiting for its prefix) would otherwise be refused and the
  // prefix recomputed — the disk tier would be written and never read.
  bool CanStartWrite() const {
    return ring_ready_ && user_ops_in_flight_ < options_.queue_depth &&
           writes_in_flight_ < MaxWritesInFlight(options_.queue_depth) && io_uring_sq_space_left(&ring_) >= 3;
  }
  bool CanStartRead() const {
    return ring_ready_ && user_ops_in_flight_ < options_.queue_depth && io_uring_sq_space_left(&ring_) >= 1;
  }
  const KvTierStats& stats() const { return stats_; }
  absl::Status CheckInvariants() const;
  std::optional<DiskRecordLocation> LocationOf(const BlockHash& hash) const {
    auto it = index_.find(hash);
    if (it == index_.end() || slots_[it->second].state != SlotState::kHeld) return std::nullopt;
    return DiskRecordLocation{.path = SlabPath(it->second / records_per_slab_),
                              .offset = SlotOffset(it->second)};
  }
  bool direct_io() const { return direct_io_; }

 private:
  std::string SlabPath(int64_t slab) const {
    return (std::filesystem::path(options_.directory) / absl::StrFormat("kv-slab-%05d.dat", slab)).string();
  }
  // O_DIRECT needs 4 KiB-aligned memory and lengths; buffered I/O takes the caller's bytes.
  bool NeedsStaging(const std::byte* p) const {
    return direct_io_ && (!IsAligned(p) || options_.record_payload_bytes != padded_payload_bytes_);
  }
  int64_t SlotOffset(int32_t slot) const { return (slot % records_per_slab_) * record_bytes_; }
  int SlotFd(int32_t slot) const { return fds_[static_cast<size_t>(slot / records_per_slab_)]; }
  absl::Status OpenSlabs();
  void Recover();
  void Preallocate();
  std::optional<int32_t> TakeFreeSlot();
  void Evict(int32_t slot);
  void FreeSlot(int32_t slot);
  void DropRecord(int32_t slot);
  void StartInvalidate(int32_t slot);
  // An SQE whose user data names the op and its link in the chain (0..2).
  io_uring_sqe* GetSqe(uint64_t op_id, uint32_t link, Op& op, uint32_t len);
  std::vector<KvIoCompletion> Reap(bool wait);
  // A completion as the reaper thread took it off the ring, with the time it did.
  struct ReapedCqe {
    uint64_t data = 0;
    int32_t res = 0;
    Clock::time_point at;
  };
  // The reaper thread waits on the completion queue and timestamps what completes, so
  // the bandwidth figures are the disk's, not the rate at which the engine polls (once
  // per step). The engine thread still handles every completion (Poll), so all state
  // but `reaped_` stays the engine thread's.
  void StartReaper();
  void StopReaper();
  void ReaperLoop();
  void HandleCqe(const ReapedCqe& cqe, std::vector<KvIoCompletion>* out);
  void FinishOp(uint64_t op_id, Op& op, std::vector<KvIoCompletion>* out, Clock::time_point now);
  void Emit(KvEvent::Kind kind, const Slot& s) {
    events_.push_back(KvEvent{.kind = kind, .block_hash = s.hash, .parent_hash = s.parent, .tier = Tier::kDisk,
                              .num_tokens = options_.block_size_tokens});
  }

  const DiskKvTierOptions options_;
  int64_t record_bytes_ = 0;
  int64_t padded_payload_bytes_ = 0;
  int32_t records_per_slab_ = 1;
  std::vector<int> fds_;
  bool direct_io_ = false;
  io_uring ring_{};
  bool ring_ready_ = false;
  static constexpr uint64_t kStopReaperData = ~uint64_t{0};
  std::thread reaper_;
  absl::Mutex reaped_mu_;
  std::vector<ReapedCqe> reaped_ ABSL_GUARDED_BY(reaped_mu_);
  bool reaper_failed_ ABSL_GUARDED_BY(reaped_mu_) = false;

  std::vector<Slot> slots_;
  absl::flat_hash_map<BlockHash, int32_t> index_;  // kWriting and kHeld slots
  std::list<int32_t> lru_;                          // kHeld slots, least recently used first
  std::vector<int32_t> free_allocated_;             // free slots whose bytes exist on disk
  std::vector<int32_t> free_fresh_;                 // free slots never written (pop_back: lowest first)
  bool disk_full_ = false;                          // after ENOSPC: reuse allocated slots only

  absl::node_hash_map<uint64_t, Op> ops_;  // node map: an Op& survives inserting another op
  uint64_t next_op_id_ = 1;
  int32_t user_ops_in_flight_ = 0;
  int32_t sqes_in_flight_ = 0;
  uint32_t ring_entries_ = 0;
  uint64_t next_sequence_ = 1;
  std::vector<AlignedBuffer> spare_staging_;
  AlignedBuffer zero_header_;

  // Bandwidth: payload bytes over the busy time of each kind, from each I/O's
  // submission to its completion as the reaper stamped it (not when the engine reaped
  // it, up to a step later), overlaps counted once (kv/busy_bandwidth.h).
  int32_t reads_in_flight_ = 0, writes_in_flight_ = 0;
  BusyBandwidth read_rate_{{.half_life_seconds = kDefaultBandwidthHalfLifeSeconds}};
  BusyBandwidth write_rate_{{.half_life_seconds = kDefaultBandwidthHalfLifeSeconds}};

  KvTierStats stats_;
  std::vector<KvEvent> events_;
};

absl::Status DiskKvTier::Impl::Init() {
  const auto& o = options_;
  if (o.directory.empty()) return absl::InvalidArgumentError("--kv-disk-cache-dir: empty");
  if (o.num_layers <= 0 || o.block_bytes <= 0 || o.record_payload_bytes != o.num_layers * o.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("disk KV tier: record_payload_bytes (", o.record_payload_bytes,
                                                   ") must be num_layers (", o.num_layers, ") * block_bytes (",
                                                   o.block_bytes, "), all positive"));
  }
  if (o.queue_depth < 1) return absl::InvalidArgumentError("disk KV tier: queue_depth must be >= 1");
  record_bytes_ = DiskRecordBytes(o.record_payload_bytes);
  padded_payload_bytes_ = record_bytes_ - kDiskRecordAlignment;
  const int64_t capacity = o.capacity_bytes / record_bytes_;
  if (capacity < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-disk-cache-bytes: ", o.capacity_bytes,
                                                   " is smaller than one record (", record_bytes_, " bytes)"));
  }
  if (capacity > (int64_t{1} << 30)) return absl::InvalidArgumentError("--kv-disk-cache-bytes: too many records");
  records_per_slab_ = static_cast<int32_t>(std::clamp<int64_t>(kSlabFileMaxBytes / record_bytes_, 1, capacity));
  slots_.resize(static_cast<size_t>(capacity));
  zero_header_ = AllocateAligned(kDiskRecordAlignment);
  if (!zero_header_) return absl::ResourceExhaustedError("disk KV tier: out of memory");

  std::error_code ec;
  std::filesystem::create_directories(o.directory, ec);
  if (ec || !std::filesystem::is_directory(o.directory, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-disk-cache-dir: cannot create directory ", o.directory, ": ",
                                                   ec ? ec.message() : "not a directory"));
  }
  if (absl::Status s = OpenSlabs(); !s.ok()) return s;

  ring_entries_ = static_cast<uint32_t>(4 * o.queue_depth);
  if (int err = io_uring_queue_init(ring_entries_, &ring_, 0); err < 0) {
    return absl::InternalError(absl::StrCat("disk KV tier: io_uring_queue_init: ", std::strerror(-err)));
  }
  ring_ready_ = true;
  StartReaper();
  Recover();
  Preallocate();
  return absl::OkStatus();
}

// Reserves the slab files' space up front (after Recover, which reads the real file
// sizes): O_DIRECT writes into allocated space neither extend the file nor allocate,
// so filesystems such as ext4 run them in parallel instead of one at a time. Where the
// space is not there (a full disk, a file-size limit, a filesystem without fallocate)
// the files stay sparse and grow as written; ENOSPC is then met per write.
void DiskKvTier::Impl::Preallocate() {
  for (size_t f = 0; f < fds_.size(); ++f) {
    const int64_t first = static_cast<int64_t>(f) * records_per_slab_;
    const int64_t slots = std::min<int64_t>(records_per_slab_, capacity_records() - first);
    if (::fallocate(fds_[f], 0, 0, slots * record_bytes_) != 0) {
      KVMESH_LOG(kInfo) << "disk KV tier: cannot preallocate; slab files grow as written"
                        << LogKv("dir", options_.directory) << LogKv("error", std::strerror(errno));
      return;
    }
    for (int64_t i = first; i < first + slots; ++i) slots_[static_cast<size_t>(i)].allocated = true;
  }
  free_fresh_.clear();
  free_allocated_.clear();
  for (auto slot = static_cast<int32_t>(capacity_records() - 1); slot >= 0; --slot) {
    if (slots_[static_cast<size_t>(slot)].state == SlotState::kFree) free_allocated_.push_back(slot);
  }
}

absl::Status DiskKvTier::Impl::OpenSlabs() {
  const int64_t num_slabs = (capacity_records() + records_per_slab_ - 1) / records_per_slab_;
  direct_io_ = options_.use_direct_io;
  for (int64_t i = 0; i < num_slabs; ++i) {
    const std::string path = SlabPath(i);
    int fd = -1;
    if (direct_io_) {
      fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0644);
      if (fd < 0 && errno == EINVAL) {
        KVMESH_LOG(kInfo) << "disk KV tier: the filesystem refuses O_DIRECT; using buffered I/O"
                          << LogKv("dir", options_.directory);
        direct_io_ = false;
      }
    }
    if (fd < 0) fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-disk-cache-dir: cannot open ", path, " for writing: ", std::strerror(errno)));
    }
    fds_.push_back(fd);
  }
  // Opening for writing can succeed where writing cannot (a read-only bind mount lets
  // open(O_CREAT) of an existing file through only with O_RDWR refused; a full or
  // quota-limited disk is reported per write instead): probe with a real file.
  const std::string probe = (std::filesystem::path(options_.directory) / ".kv-write-probe").string();
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-disk-cache-dir: ", options_.directory, " is not writable: ", std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

// Rebuilds the index from the headers. Payloads are verified when read.
void DiskKvTier::Impl::Recover() {
  struct Found {
    uint64_t sequence;
    int32_t slot;
  };
  std::vector<Found> found;
  absl::flat_hash_map<BlockHash, size_t> by_hash;  // index into `found`
  AlignedBuffer buf = AllocateAligned(kDiskRecordAlignment);
  int64_t corrupt = 0, foreign = 0, truncated = 0, duplicate = 0;
  for (size_t f = 0; f < fds_.size(); ++f) {
    struct stat st {};
    if (::fstat(fds_[f], &st) != 0) continue;
    const int64_t size = st.st_size;
    for (int32_t i = 0; i < records_per_slab_; ++i) {
      const int64_t slot64 = static_cast<int64_t>(f) * records_per_slab_ + i;
      if (slot64 >= capacity_records()) break;
      const auto slot = static_cast<int32_t>(slot64);
      const int64_t offset = SlotOffset(slot);
      if (offset >= size) break;
      Slot& s = slots_[static_cast<size_t>(slot)];
      s.allocated = offset + kDiskRecordAlignment + options_.record_payload_bytes <= size;
      const ssize_t n = ::pread(fds_[f], buf.get(), kDiskRecordAlignment, offset);
      if (n <= 0) break;
      RecordHeader h;
      std::memcpy(&h, buf.get(), sizeof(h));
      const bool all_zero = std::all_of(buf.get(), buf.get() + n, [](std::byte b) { return b == std::byte{0}; });
      if (all_zero) continue;  // an empty or invalidated slot
      s.header_maybe_valid = true;
      if (n < static_cast<ssize_t>(sizeof(h)) || h.magic != kMagic || h.header_checksum != HeaderChecksum(h)) {
        ++corrupt;
        continue;
      }
      if (h.version != kDiskRecordFormatVersion || h.salt != options_.salt || h.dtype != options_.dtype ||
          h.num_layers != options_.num_layers || h.block_bytes != options_.block_bytes ||
          h.payload_bytes != options_.record_payload_bytes || h.header_bytes != kDiskRecordAlignment) {
        ++foreign;
        continue;
      }
      if (!s.allocated) {
        ++truncated;
        continue;
      }
      const BlockHash hash{h.hash_low, h.hash_high};
      if (auto it = by_hash.find(hash); it != by_hash.end()) {
        ++duplicate;  // not counted as skipped: the data is good, one copy is enough
        if (found[it->second].sequence > h.sequence) continue;
        found[it->second].slot = -1;  // the older copy's slot becomes free
      }
      by_hash[hash] = found.size();
      found.push_back(Found{.sequence = h.sequence, .slot = slot});
      s.hash = hash;
      s.parent = BlockHash{h.parent_low, h.parent_high};
      s.checksum = h.payload_checksum;
      next_sequence_ = std::max(next_sequence_, h.sequence + 1);
    }
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.sequence < b.sequence; });
  for (const Found& f : found) {
    if (f.slot < 0) continue;
    Slot& s = slots_[static_cast<size_t>(f.slot)];
    s.state = SlotState::kHeld;
    s.lru = lru_.insert(lru_.end(), f.slot);
    index_[s.hash] = f.slot;
    Emit(KvEvent::Kind::kStored, s);
  }
  for (auto slot = static_cast<int32_t>(capacity_records() - 1); slot >= 0; --slot) {
    Slot& s = slots_[static_cast<size_t>(slot)];
    if (s.state != SlotState::kFree) continue;
    (s.allocated ? free_allocated_ : free_fresh_).push_back(slot);
  }
  stats_.skipped_records = corrupt + foreign + truncated;
  if (stats_.skipped_records > 0) {
    KVMESH_LOG(kWarning) << "disk KV tier: skipped records that do not verify or belong to another model"
                         << LogKv("dir", options_.directory) << LogKv("records", lru_.size())
                         << LogKv("skipped_corrupt", corrupt) << LogKv("skipped_foreign", foreign)
                         << LogKv("skipped_truncated", truncated) << LogKv("duplicates", duplicate);
  } else if (!lru_.empty()) {
    KVMESH_LOG(kInfo) << "disk KV tier: recovered records" << LogKv("dir", options_.directory)
                      << LogKv("records", lru_.size()) << LogKv("duplicates", duplicate);
  }
}

std::optional<int32_t> DiskKvTier::Impl::TakeFreeSlot() {
  auto take = [](std::vector<int32_t>& v) {
    const int32_t slot = v.back();
    v.pop_back();
    return slot;
  };
  if (!free_allocated_.empty()) return take(free_allocated_);
  if (!disk_full_ && !free_fresh_.empty()) return take(free_fresh_);
  // Evict the least recently used record that no read pins.
  for (int32_t slot : lru_) {
    if (slots_[static_cast<size_t>(slot)].pins == 0) {
      Evict(slot);
      return take(free_allocated_);
    }
  }
  return std::nullopt;
}

void DiskKvTier::Impl::Evict(int32_t slot) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  ++stats_.evictions;
  Emit(KvEvent::Kind::kRemoved, s);
  lru_.erase(s.lru);
  index_.erase(s.hash);
  // NOTE: its header stays valid on disk; the next write to the slot zeroes it first.
  // Until then a restart brings the (intact) record back.
  FreeSlot(slot);
}

void DiskKvTier::Impl::FreeSlot(int32_t slot) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  s.state = SlotState::kFree;
  s.pins = 0;
  if (s.allocated) {
    free_allocated_.push_back(slot);
  } else {
    free_fresh_.push_back(slot);
  }
}

// A record that failed verification leaves the index now and its slot once no read
// pins it and its header has been zeroed, so a restart cannot bring it back.
void DiskKvTier::Impl::DropRecord(int32_t slot) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (s.state == SlotState::kHeld) {
    Emit(KvEvent::Kind::kRemoved, s);
    lru_.erase(s.lru);
    index_.erase(s.hash);
    s.state = SlotState::kDropping;
  }
  if (s.pins == 0) StartInvalidate(slot);
}

io_uring_sqe* DiskKvTier::Impl::GetSqe(uint64_t op_id, uint32_t link, Op& op, uint32_t len) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) {
    io_uring_submit(&ring_);
    sqe = io_uring_get_sqe(&ring_);
  }
  if (sqe != nullptr) {
    io_uring_sqe_set_data64(sqe, (op_id << 2) | link);
    op.lens[link] = len;
    ++op.pending_cqes;
    ++sqes_in_flight_;
  }
  return sqe;
}

void DiskKvTier::Impl::StartInvalidate(int32_t slot) {
  const uint64_t id = next_op_id_++;
  Op& op = ops_[id];
  op.kind = OpKind::kInvalidate;
  op.slot = slot;
  op.start = Clock::now();
  io_uring_sqe* sqe = GetSqe(id, 0, op, kDiskRecordAlignment);
  if (sqe == nullptr) {  // cannot happen within ring_entries_; keep the slot out of use
    KVMESH_LOG(kError) << "disk KV tier: no submission entry to invalidate a dropped record" << LogKv("slot", slot);
    ops_.erase(id);
    return;
  }
  io_uring_prep_write(sqe, SlotFd(slot), zero_header_.get(), kDiskRecordAlignment, static_cast<uint64_t>(SlotOffset(slot)));
  io_uring_submit(&ring_);
}

absl::StatusOr<int64_t> DiskKvTier::Impl::StartWrite(const BlockHash& hash, const BlockHash& parent,
                                                     std::span<const std::byte> payload, uint64_t checksum) {
  if (static_cast<int64_t>(payload.size()) != options_.record_payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("disk KV tier: payload of ", payload.size(), " bytes, want ",
                                                   options_.record_payload_bytes));
  }
  if (index_.contains(hash)) return absl::AlreadyExistsError(absl::StrCat("disk KV tier: ", hash.ToHex(), " held"));
  if (!CanStartWrite()) {
    ++stats_.write_failures;
    return absl::ResourceExhaustedError("disk KV tier: I/O queue full");
  }
  // Stage before taking a slot so a failure here has no side effects.
  AlignedBuffer staging;
  const std::byte* src = payload.data();
  if (NeedsStaging(src)) {
    if (!spare_staging_.empty()) {
      staging = std::move(spare_staging_.back());
      spare_staging_.pop_back();
    } else {
      staging = AllocateAligned(padded_payload_bytes_);
    }
    if (!staging) return absl::ResourceExhaustedError("disk KV tier: out of memory for staging");
    std::memcpy(staging.get(), payload.data(), payload.size());
    src = staging.get();
  }
  AlignedBuffer header = AllocateAligned(kDiskRecordAlignment);
  if (!header) return absl::ResourceExhaustedError("disk KV tier: out of memory for a header");
  const std::optional<int32_t> slot_or = TakeFreeSlot();
  if (!slot_or) {
    if (staging) spare_staging_.push_back(std::move(staging));
    ++stats_.write_failures;
    return absl::ResourceExhaustedError(disk_full_ ? "disk KV tier: disk full and every record is being read"
                                                   : "disk KV tier: every slot is being read or written");
  }
  const int32_t slot = *slot_or;
  Slot& s = slots_[static_cast<size_t>(slot)];
  s.state = SlotState::kWriting;
  s.hash = hash;
  s.parent = parent;
  s.checksum = checksum;
  index_[hash] = slot;

  const RecordHeader h{.magic = kMagic, .version = kDiskRecordFormatVersion,
                       .header_bytes = static_cast<uint32_t>(kDiskRecordAlignment), .salt = options_.salt,
                       .hash_low = hash.low, .hash_high = hash.high, .parent_low = parent.low,
                       .parent_high = parent.high, .dtype = options_.dtype, .num_layers = options_.num_layers,
                       .block_bytes = options_.block_bytes, .payload_bytes = options_.record_payload_bytes,
                       .payload_checksum = checksum, .sequence = next_sequence_++, .header_checksum = 0};
  RecordHeader with_checksum = h;
  with_checksum.header_checksum = HeaderChecksum(h);
  std::memcpy(header.get(), &with_checksum, sizeof(with_checksum));

  const uint64_t id = next_op_id_++;
  Op& op = ops_[id];
  op.kind = OpKind::kWrite;
  op.slot = slot;
  op.hash = hash;
  op.staging = std::move(staging);
  op.header = std::move(header);
  op.start = Clock::now();
  const int fd = SlotFd(slot);
  const auto offset = static_cast<uint64_t>(SlotOffset(slot));
  const auto payload_len = static_cast<uint32_t>(op.staging ? padded_payload_bytes_ : payload.size());
  // (1) zero a header that may still verify, (2) payload, (3) header: linked, so each
  // starts only after the previous one succeeded in full. The ring holds 4 SQEs per
  // op in flight, so these never run out.
  if (s.header_maybe_valid) {
    io_uring_sqe* sqe = GetSqe(id, 0, op, kDiskRecordAlignment);
    io_uring_prep_write(sqe, fd, zero_header_.get(), kDiskRecordAlignment, offset);
    sqe->flags |= IOSQE_IO_LINK;
  }
  io_uring_sqe* sqe = GetSqe(id, 1, op, payload_len);
  io_uring_prep_write(sqe, fd, op.staging ? op.staging.get() : src, payload_len, offset + kDiskRecordAlignment);
  sqe->flags |= IOSQE_IO_LINK;
  sqe = GetSqe(id, 2, op, kDiskRecordAlignment);
  io_uring_prep_write(sqe, fd, op.header.get(), kDiskRecordAlignment, offset);
  s.header_maybe_valid = true;  // from now on, whatever happens
  ++writes_in_flight_;
  write_rate_.Begin(op.start);
  ++user_ops_in_flight_;
  stats_.in_flight = user_ops_in_flight_;
  io_uring_submit(&ring_);
  return static_cast<int64_t>(id);
}

absl::StatusOr<int64_t> DiskKvTier::Impl::StartRead(const BlockHash& hash, std::span<std::byte> dst) {
  if (static_cast<int64_t>(dst.size()) != options_.record_payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("disk KV tier: read buffer of ", dst.size(), " bytes, want ",
                                                   options_.record_payload_bytes));
  }
  auto it = index_.find(hash);
  if (it == index_.end() || slots_[it->second].state != SlotState::kHeld) {
    return absl::NotFoundError(absl::StrCat("disk KV tier: ", hash.ToHex(), " not held"));
  }
  if (!CanStartRead()) {
    return absl::ResourceExhaustedError("disk KV tier: I/O queue full");
  }
  const int32_t slot = it->second;
  AlignedBuffer staging;
  std::byte* into = dst.data();
  if (NeedsStaging(into)) {
    if (!spare_staging_.empty()) {
      staging = std::move(spare_staging_.back());
      spare_staging_.pop_back();
    } else {
      staging = AllocateAligned(padded_payload_bytes_);
    }
    if (!staging) return absl::ResourceExhaustedError("disk KV tier: out of memory for staging");
    into = staging.get();
  }
  Slot& s = slots_[static_cast<size_t>(slot)];
  ++s.pins;
  lru_.splice(lru_.end(), lru_, s.lru);  // a read is a use
  const uint64_t id = next_op_id_++;
  Op& op = ops_[id];
  op.kind = OpKind::kRead;
  op.slot = slot;
  op.hash = hash;
  op.read_dst = dst;
  op.start = Clock::now();
  const auto len = static_cast<uint32_t>(staging ? padded_payload_bytes_ : dst.size());
  op.staging = std::move(staging);
  // A read needs the payload's bytes; the padding after the file's last record may be absent.
  io_uring_sqe* sqe = GetSqe(id, 0, op, static_cast<uint32_t>(options_.record_payload_bytes));
  io_uring_prep_read(sqe, SlotFd(slot), into, len, static_cast<uint64_t>(SlotOffset(slot) + kDiskRecordAlignment));
  ++reads_in_flight_;
  read_rate_.Begin(op.start);
  ++user_ops_in_flight_;
  stats_.in_flight = user_ops_in_flight_;
  io_uring_submit(&ring_);
  return static_cast<int64_t>(id);
}

void DiskKvTier::Impl::StartReaper() {
  reaper_ = std::thread([this] { ReaperLoop(); });
}

void DiskKvTier::Impl::ReaperLoop() {
  while (true) {
    io_uring_cqe* cqe = nullptr;
    const int err = io_uring_wait_cqe(&ring_, &cqe);
    if (err == -EINTR) continue;
    if (err < 0 || cqe == nullptr) {
      KVMESH_LOG(kError) << "disk KV tier: io_uring_wait_cqe: " << std::strerror(-err);
      absl::MutexLock lock(&reaped_mu_);
      reaper_failed_ = true;
      return;
    }
    const ReapedCqe reaped{.data = io_uring_cqe_get_data64(cqe), .res = cqe->res, .at = Clock::now()};
    io_uring_cqe_seen(&ring_, cqe);
    if (reaped.data == kStopReaperData) return;
    absl::MutexLock lock(&reaped_mu_);
    reaped_.push_back(reaped);
  }
}

void DiskKvTier::Impl::StopReaper() {
  if (!reaper_.joinable()) return;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) {
    io_uring_submit(&ring_);
    sqe = io_uring_get_sqe(&ring_);
  }
  if (sqe == nullptr) {  // cannot happen once Drain emptied the ring
    KVMESH_LOG(kError) << "disk KV tier: no submission entry to stop the reaper; leaving it";
    reaper_.detach();
    return;
  }
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data64(sqe, kStopReaperData);
  io_uring_submit(&ring_);
  reaper_.join();
}

std::vector<KvIoCompletion> DiskKvTier::Impl::Reap(bool wait) {
  std::vector<KvIoCompletion> out;
  if (!ring_ready_) return out;
  while (true) {
    std::vector<ReapedCqe> batch;
    {
      absl::MutexLock lock(&reaped_mu_);
      if (wait && !ops_.empty() && reaped_.empty() && !reaper_failed_) {
        auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(reaped_mu_) { return !reaped_.empty() || reaper_failed_; };
        if (!reaped_mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(60))) {
          KVMESH_LOG(kError) << "disk KV tier: I/O did not complete within 60 s" << LogKv("ops", ops_.size());
        }
      }
      batch.swap(reaped_);
    }
    for (const ReapedCqe& c : batch) HandleCqe(c, &out);
    if (!wait || batch.empty() || ops_.empty()) break;
  }
  stats_.read_bytes_per_second = read_rate_.units_per_second();
  stats_.write_bytes_per_second = write_rate_.units_per_second();
  stats_.in_flight = user_ops_in_flight_;
  return out;
}

void DiskKvTier::Impl::HandleCqe(const ReapedCqe& cqe, std::vector<KvIoCompletion>* out) {
  --sqes_in_flight_;
  const uint64_t data = cqe.data;
  const uint64_t id = data >> 2;
  const size_t link = data & 3;
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  Op& op = it->second;
  if (cqe.res < 0) {
    // A failed or short link cancels the rest of its chain: those arrive as -ECANCELED.
    if (cqe.res != -ECANCELED && op.first_error == 0) op.first_error = -cqe.res;
  } else if (link < op.lens.size() && static_cast<uint32_t>(cqe.res) < op.lens[link]) {
    op.short_io = true;
  }
  if (--op.pending_cqes > 0) return;
  FinishOp(id, op, out, cqe.at);
}

void DiskKvTier::Impl::FinishOp(uint64_t op_id, Op& op, std::vector<KvIoCompletion>* out, Clock::time_point now) {
  Slot& s = slots_[static_cast<size_t>(op.slot)];
  const int err = op.first_error;
  auto recycle = [this](AlignedBuffer& b) {
    if (b) spare_staging_.push_back(std::move(b));
  };
  switch (op.kind) {
    case OpKind::kInvalidate:
      s.header_maybe_valid = err != 0;
      FreeSlot(op.slot);
      break;
    case OpKind::kWrite: {
      --writes_in_flight_;
      --user_ops_in_flight_;
      KvIoCompletion c{.ticket = static_cast<int64_t>(op_id), .kind = KvIoCompletion::Kind::kWrite, .hash = op.hash,
                         .completed_at = now};
      if (err == 0 && !op.short_io) {
        s.state = SlotState::kHeld;
        s.allocated = true;
        s.lru = lru_.insert(lru_.end(), op.slot);
        ++stats_.blocks_offloaded;
        stats_.bytes_offloaded += options_.record_payload_bytes;
        c.bytes = options_.record_payload_bytes;
        Emit(KvEvent::Kind::kStored, s);
      } else {
        ++stats_.write_failures;
        index_.erase(op.hash);
        if (IsDiskFull(err) || op.short_io) {
          // 1. This write fails; 2. the files stop growing (fresh slots are no longer
          // used); 3. the least recently used record is evicted so the next write has
          // a slot whose space already exists on disk.
          if (!disk_full_) {
            KVMESH_LOG(kWarning) << "disk KV tier: disk full; evicting and reusing written slots only"
                                 << LogKv("dir", options_.directory) << LogKv("records", lru_.size())
                                 << LogKv("error", std::strerror(err != 0 ? err : ENOSPC));
          }
          disk_full_ = true;
          s.allocated = false;  // its space may not exist: never reused while the disk is full
          FreeSlot(op.slot);
          for (int32_t victim : lru_) {
            if (slots_[static_cast<size_t>(victim)].pins == 0) {
              Evict(victim);
              break;
            }
          }
          c.status = absl::ResourceExhaustedError(
              absl::StrCat("disk KV tier: disk full (", std::strerror(err != 0 ? err : ENOSPC), ")"));
        } else {
          FreeSlot(op.slot);
          c.status = err == EIO ? absl::UnavailableError(absl::StrCat("disk KV tier: write: ", std::strerror(err)))
                                : absl::InternalError(absl::StrCat("disk KV tier: write: ", std::strerror(err)));
        }
      }
      write_rate_.End(op.start, now, c.bytes);
      recycle(op.staging);
      out->push_back(std::move(c));
      break;
    }
    case OpKind::kRead: {
      --reads_in_flight_;
      --user_ops_in_flight_;
      --s.pins;
      KvIoCompletion c{.ticket = static_cast<int64_t>(op_id), .kind = KvIoCompletion::Kind::kRead, .hash = op.hash,
                         .completed_at = now};
      if (err == 0 && !op.short_io) {
        if (op.staging) std::memcpy(op.read_dst.data(), op.staging.get(), op.read_dst.size());
        if (Checksum(op.read_dst) == s.checksum) {
          c.checksum = s.checksum;
          ++stats_.blocks_onboarded;
          stats_.bytes_onboarded += options_.record_payload_bytes;
          c.bytes = options_.record_payload_bytes;
        } else {
          ++stats_.checksum_failures;
          KVMESH_LOG(kWarning) << "disk KV tier: checksum mismatch; record dropped" << LogKv("hash", op.hash.ToHex())
                               << LogKv("slot", op.slot);
          c.status = absl::DataLossError(absl::StrCat("disk KV tier: checksum mismatch for ", op.hash.ToHex()));
          DropRecord(op.slot);
        }
      } else {
        ++stats_.checksum_failures;
        c.status = op.short_io ? absl::DataLossError(absl::StrCat("disk KV tier: record of ", op.hash.ToHex(),
                                                                  " truncated"))
                               : absl::DataLossError(absl::StrCat("disk KV tier: read of ", op.hash.ToHex(), ": ",
                                                                  std::strerror(err)));
        DropRecord(op.slot);
      }
      if (s.state == SlotState::kDropping && s.pins == 0 && c.status.ok()) StartInvalidate(op.slot);
      read_rate_.End(op.start, now, c.bytes);
      recycle(op.staging);
      out->push_back(std::move(c));
      break;
    }
  }
  ops_.erase(op_id);
}

absl::Status DiskKvTier::Impl::CheckInvariants() const {
  auto fail = [](auto... parts) { return absl::InternalError(absl::StrCat("disk KV tier invariant: ", parts...)); };
  int64_t held = 0, writing = 0, free_slots = 0, dropping = 0, pins = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    pins += s.pins;
    switch (s.state) {
      case SlotState::kHeld: {
        ++held;
        auto it = index_.find(s.hash);
        if (it == index_.end() || it->second != static_cast<int32_t>(i)) return fail("held slot ", i, " not indexed");
        if (*s.lru != static_cast<int32_t>(i)) return fail("held slot ", i, " LRU entry is ", *s.lru);
        break;
      }
      case SlotState::kWriting: {
        ++writing;
        auto it = index_.find(s.hash);
        if (it == index_.end() || it->second != static_cast<int32_t>(i)) return fail("writing slot ", i, " not indexed");
        if (s.pins != 0) return fail("writing slot ", i, " pinned");
        break;
      }
      case SlotState::kFree:
        ++free_slots;
        if (s.pins != 0) return fail("free slot ", i, " pinned");
        break;
      case SlotState::kDropping: ++dropping; break;
    }
  }
  if (held != static_cast<int64_t>(lru_.size())) return fail("held ", held, " != LRU ", lru_.size());
  if (held + writing != static_cast<int64_t>(index_.size())) return fail("index size ", index_.size());
  if (free_slots != static_cast<int64_t>(free_allocated_.size() + free_fresh_.size())) {
    return fail("free slots ", free_slots, " != free lists ", free_allocated_.size() + free_fresh_.size());
  }
  for (int32_t slot : free_allocated_) {
    if (slots_[static_cast<size_t>(slot)].state != SlotState::kFree || !slots_[static_cast<size_t>(slot)].allocated) {
      return fail("free_allocated slot ", slot, " wrong state");
    }
  }
  for (int32_t slot : free_fresh_) {
    if (slots_[static_cast<size_t>(slot)].state != SlotState::kFree || slots_[static_cast<size_t>(slot)].allocated) {
      return fail("free_fresh slot ", slot, " wrong state");
    }
  }
  int64_t reads = 0, writes = 0;
  for (const auto& [id, op] : ops_) {
    if (op.kind == OpKind::kRead) ++reads;
    if (op.kind == OpKind::kWrite) {
      ++writes;
      if (slots_[static_cast<size_t>(op.slot)].state != SlotState::kWriting) return fail("write op on a non-writing slot");
    }
  }
  if (writes != writing) return fail("write ops ", writes, " != writing slots ", writing);
  if (reads != pins) return fail("read ops ", reads, " != pins ", pins);
  if (reads + writes != user_ops_in_flight_) return fail("ops in flight ", user_ops_in_flight_);
  if (user_ops_in_flight_ > options_.queue_depth) return fail("over queue depth");
  return absl::OkStatus();
}

// ---- DiskKvTier: forwards to Impl. ----

absl::StatusOr<std::unique_ptr<DiskKvTier>> DiskKvTier::Create(const DiskKvTierOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  if (absl::Status s = impl->Init(); !s.ok()) return s;
  return std::unique_ptr<DiskKvTier>(new DiskKvTier(std::move(impl)));
}
DiskKvTier::DiskKvTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DiskKvTier::~DiskKvTier() = default;
bool DiskKvTier::Lookup(const BlockHash& hash) { return impl_->Lookup(hash); }
bool DiskKvTier::Contains(const BlockHash& hash) const { return impl_->Contains(hash); }
KvConnectorMatch DiskKvTier::Match(std::span<const BlockHash> hashes, size_t first, size_t limit) {
  int32_t held = 0;
  for (size_t i = first; i < limit && (held == 0 || Contains(hashes[i])); ++i, ++held) {
    if (!Lookup(hashes[i])) break;
  }
  return {.num_blocks = held};
}
absl::StatusOr<int64_t> DiskKvTier::StartSave(const BlockHash& hash, const BlockHash& parent_hash,
                                               std::span<const std::byte> payload, uint64_t checksum) {
  return impl_->StartWrite(hash, parent_hash, payload, checksum);
}
absl::StatusOr<int64_t> DiskKvTier::StartLoad(const BlockHash& hash, std::span<std::byte> dst) {
  return impl_->StartRead(hash, dst);
}
std::vector<KvIoCompletion> DiskKvTier::Poll() { return impl_->Poll(); }
std::vector<KvIoCompletion> DiskKvTier::Drain() { return impl_->Drain(); }
std::vector<KvEvent> DiskKvTier::DrainEvents() { return impl_->DrainEvents(); }
int64_t DiskKvTier::num_records() const { return impl_->num_records(); }
int64_t DiskKvTier::capacity_records() const { return impl_->capacity_records(); }
int32_t DiskKvTier::num_in_flight() const { return impl_->num_in_flight(); }
bool DiskKvTier::CanStartSave() const { return impl_->CanStartWrite(); }
bool DiskKvTier::CanStartLoad() const { return impl_->CanStartRead(); }
const KvTierStats& DiskKvTier::stats() const { return impl_->stats(); }
absl::Status DiskKvTier::CheckInvariants() const { return impl_->CheckInvariants(); }
std::optional<DiskRecordLocation> DiskKvTier::LocationOf(const BlockHash& hash) const { return impl_->LocationOf(hash); }
bool DiskKvTier::direct_io() const { return impl_->direct_io(); }

}  // namespace kvmesh::kv
