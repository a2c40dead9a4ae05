#include "kv/kv_layout.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include <omp.h>

#include "absl/strings/str_cat.h"
#include "core/huge_pages.h"
#include "core/omp_team_sync.h"
#include "core/status_macros.h"
#include "kv/checksum.h"
#include "kv/streaming_copy.h"

namespace kvmesh::kv {
namespace {

constexpr size_t kAlignmentBytes = 64;

bool IsKvDType(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kFP8E4M3:
    case DType::kInt8: return true;
    default: return false;
  }
}

// a * b, or -1 on overflow or a negative operand.
int64_t CheckedMul(int64_t a, int64_t b) {
  int64_t out;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &out)) return -1;
  return out;
}

std::string ShapeString(const KvLayoutOptions& o) {
  return absl::StrCat(o.num_layers, " layers x [2, ", o.num_kv_heads, " kv heads, ", o.block_size_tokens,
                      " tokens, ", o.head_dim, " head_dim] ", ToAbsl(DTypeName(o.dtype)));
}

}  // namespace

int64_t KvBlockBytes(const KvLayoutOptions& shape) {
  if (shape.num_kv_heads <= 0 || shape.head_dim <= 0 || shape.block_size_tokens <= 0) return 0;
  int64_t bytes = 2 * DTypeSize(shape.dtype);
  for (const int64_t d : {int64_t{shape.num_kv_heads}, int64_t{shape.block_size_tokens}, int64_t{shape.head_dim}}) {
    bytes = CheckedMul(bytes, d);
    if (bytes < 0) return 0;
  }
  return bytes;
}

int32_t NumBlocksForBudget(const KvLayoutOptions& shape, int64_t budget_bytes) {
  if (shape.num_layers <= 0 || budget_bytes <= 0) return 0;
  const int64_t per_block = CheckedMul(KvBlockBytes(shape), shape.num_layers);
  if (per_block <= 0) return 0;
  const int64_t n = budget_bytes / per_block;
  return n > std::numeric_limits<int32_t>::max() ? std::numeric_limits<int32_t>::max() : static_cast<int32_t>(n);
}

absl::StatusOr<KvLayout> KvLayout::Create(const KvLayoutOptions& o) {
  if (o.num_layers <= 0 || o.num_kv_heads <= 0 || o.head_dim <= 0 || o.block_size_tokens <= 0 ||
      o.kv_head_replication <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV layout needs positive dimensions, got ", ShapeString(o)));
  }
  if (!IsKvDType(o.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout: ", ToAbsl(DTypeName(o.dtype)), " is not a KV element type"));
  }
  if ((o.budget_bytes > 0) == (o.num_blocks > 0) || o.budget_bytes < 0 || o.num_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV layout: set exactly one of budget_bytes (", o.budget_bytes,
                                                   ") and num_blocks (", o.num_blocks, ")"));
  }
  const int64_t block_bytes = KvBlockBytes(o);
  const int64_t per_block_all_layers = CheckedMul(block_bytes, o.num_layers);
  if (block_bytes <= 0 || per_block_all_layers <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV layout: block size overflows for ", ShapeString(o)));
  }
  int32_t num_blocks = o.num_blocks;
  if (o.budget_bytes > 0) {
    num_blocks = NumBlocksForBudget(o, o.budget_bytes);
    if (num_blocks < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV budget of ", o.budget_bytes, " bytes cannot hold even one block per layer: one block is ", block_bytes,
          " bytes (", ShapeString(o), ") x ", o.num_layers, " layers = ", per_block_all_layers, " bytes"));
    }
  }
  if (CheckedMul(per_block_all_layers, num_blocks) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout: ", num_blocks, " blocks of ", per_block_all_layers, " bytes overflow int64"));
  }
  KvLayout layout;
  layout.num_layers_ = o.num_layers;
  layout.num_kv_heads_ = o.num_kv_heads;
  layout.head_dim_ = o.head_dim;
  layout.block_size_tokens_ = o.block_size_tokens;
  layout.num_blocks_ = num_blocks;
  layout.dtype_ = o.dtype;
  layout.kv_head_replication_ = o.kv_head_replication;
  layout.block_bytes_ = block_bytes;
  return layout;
}

int64_t KvLayout::SlotOffset(int32_t layer, int32_t kv, int32_t head, int64_t slot) const {
  const int64_t block = slot / block_size_tokens_;
  const int64_t offset = slot % block_size_tokens_;
  // K is dimension-major ([D][B]: the token's dimension 0, the rest B apart); V is
  // token-major ([B][D]: the token's row).
  const int64_t head_start = (static_cast<int64_t>(kv) * num_kv_heads_ + head) * block_size_tokens_ * head_dim_;
  const int64_t elements = head_start + (kv == 0 ? offset : offset * head_dim_);
  return static_cast<int64_t>(layer) * LayerBytes() + block * block_bytes_ + elements * DTypeSize(dtype_);
}

void KvStorage::FreeDeleter::operator()(std::byte* p) const { std::free(p); }

absl::StatusOr<std::unique_ptr<KvStorage>> KvStorage::Create(const KvLayoutOptions& options) {
  absl::StatusOr<KvLayout> layout = KvLayout::Create(options);
  if (!layout.ok()) return layout.status();
  const int64_t bytes = layout->TotalBytes();
  // NOTE: pools of a huge page or more are huge-page aligned and advised: paged
  // attention walks scattered 4 KiB head-blocks, and with 4 KiB pages every tile
  // would cost a TLB miss and stop the hardware prefetcher at the page boundary.
  const bool huge = static_cast<size_t>(bytes) >= kHugePageBytes;
  // std::aligned_alloc wants a multiple of the alignment.
  const size_t rounded =
      huge ? RoundUpToHugePages(bytes) : (static_cast<size_t>(bytes) + kAlignmentBytes - 1) / kAlignmentBytes * kAlignmentBytes;
  Memory memory(huge ? AllocateHugePageMemory(bytes).release()
                     : static_cast<std::byte*>(std::aligned_alloc(kAlignmentBytes, rounded)));
  if (memory == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("KV storage: cannot allocate ", bytes, " bytes"));
  }
  std::memset(memory.get(), 0, rounded);
  return std::unique_ptr<KvStorage>(new KvStorage(*layout, std::move(memory)));
}

TensorView KvStorage::LayerView(int32_t layer) {
  return TensorView::Contiguous(data_.get() + layout_.BlockOffset(layer, BlockId{0}), layout_.dtype(),
                                {layout_.num_blocks(), 2, layout_.num_kv_heads(), layout_.block_size_tokens(),
                                 layout_.head_dim()});
}

absl::Status KvStorage::CheckSwapBlocks(std::span<const KvHostCopy> copies, std::span<const uint64_t> checksums,
                                        const char* what) const {
  if (!checksums.empty() && checksums.size() != copies.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", checksums.size(), " checksums asked for ", copies.size(), " copies"));
  }
  for (const KvHostCopy& c : copies) {
    if (c.block.value < 0 || c.block.value >= layout_.num_blocks()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": block ", c.block.value, " outside [0, ", layout_.num_blocks(), ")"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Runs `share(begin, end)` over `count` items split into contiguous shares, one per
// thread of an OpenMP team of min(num_threads, count): in order on the calling thread
// when that is one. Contiguous, so each share keeps the caller's order for its prefetch
// pipeline.
template <typename Share>
void ForEachShare(size_t count, int num_threads, const Share& share) {
  const int threads = static_cast<int>(std::min<size_t>(count, static_cast<size_t>(std::max(1, num_threads))));
  if (threads <= 1) {
    share(size_t{0}, count);
    return;
  }
  core::OmpTeamSync sync;
  sync.BeforeFork();
#pragma omp parallel num_threads(threads)
  {
    sync.AtThreadStart();
    const size_t t = static_cast<size_t>(omp_get_thread_num());
    const size_t n = static_cast<size_t>(omp_get_num_threads());
    share(count * t / n, count * (t + 1) / n);
    sync.AtThreadEnd();
  }
  sync.AfterJoin();
}

}  // namespace

absl::Status KvStorage::SwapOut(std::span<const KvHostCopy> copies, std::span<uint64_t> checksums,
                                int num_threads) const {
  KVMESH_RETURN_IF_ERROR(CheckSwapBlocks(copies, checksums, "SwapOut"));
  ForEachShare(copies.size(), num_threads, [&](size_t begin, size_t end) {
    SwapOutShare(copies.subspan(begin, end - begin),
                 checksums.empty() ? checksums : checksums.subspan(begin, end - begin));
  });
  return absl::OkStatus();
}

void KvStorage::SwapOutShare(std::span<const KvHostCopy> copies, std::span<uint64_t> checksums) const {
  const size_t bytes = static_cast<size_t>(layout_.BlockBytes());
  const int32_t layers = layout_.num_layers();
  for (size_t c = 0; c < copies.size(); ++c) {
    std::optional<ChecksumStream> checksum;
    if (!checksums.empty()) checksum.emplace();
    for (int32_t layer = 0; layer < layers; ++layer) {
      // The source read next: this block's next layer, else the next block's first.
      const std::byte* next = layer + 1 < layers      ? data_.get() + layout_.BlockOffset(layer + 1, copies[c].block)
                              : c + 1 < copies.size() ? data_.get() + layout_.BlockOffset(0, copies[c + 1].block)
                                                      : nullptr;
      const std::byte* src = data_.get() + layout_.BlockOffset(layer, copies[c].block);
      StreamingCopy(copies[c].host + static_cast<size_t>(layer) * bytes, src, bytes, next);
      if (checksum.has_value()) checksum->Update(src, bytes);  // the slice the copy just read: in L1/L2
    }
    if (checksum.has_value()) checksums[c] = checksum->Digest();
  }
  StreamingCopyFence();  // this thread's stores; the team's closing barrier orders them for the caller
}

absl::Status KvStorage::SwapIn(std::span<const KvHostCopy> copies, std::span<uint64_t> checksums,
                               int num_threads) {
  KVMESH_RETURN_IF_ERROR(CheckSwapBlocks(copies, checksums, "SwapIn"));
  ForEachShare(copies.size(), num_threads, [&](size_t begin, size_t end) {
    SwapInShare(copies.subspan(begin, end - begin),
                checksums.empty() ? checksums : checksums.subspan(begin, end - begin));
  });
  return absl::OkStatus();
}

void KvStorage::SwapInShare(std::span<const KvHostCopy> copies, std::span<uint64_t> checksums) {
  const size_t bytes = static_cast<size_t>(layout_.BlockBytes());
  const int32_t layers = layout_.num_layers();
  for (size_t c = 0; c < copies.size(); ++c) {
    std::optional<ChecksumStream> checksum;
    if (!checksums.empty()) checksum.emplace();
    for (int32_t layer = 0; layer < layers; ++layer) {
      const std::byte* next = layer + 1 < layers      ? copies[c].host + static_cast<size_t>(layer + 1) * bytes
                              : c + 1 < copies.size() ? copies[c + 1].host
                                                      : nullptr;
      const std::byte* src = copies[c].host + static_cast<size_t>(layer) * bytes;
      StreamingCopy(data_.get() + layout_.BlockOffset(layer, copies[c].block), src, bytes, next);
      if (checksum.has_value()) checksum->Update(src, bytes);  // the slice the copy just read: in L1/L2
    }
    if (checksum.has_value()) checksums[c] = checksum->Digest();
  }
  StreamingCopyFence();
}

absl::Status KvStorage::CopyBlock(BlockId src, BlockId dst) {
  const int32_t n = layout_.num_blocks();
  if (src.value < 0 || src.value >= n || dst.value < 0 || dst.value >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyBlock: blocks ", src.value, " -> ", dst.value, " outside [0, ", n, ")"));
  }
  if (src == dst) return absl::OkStatus();
  for (int32_t layer = 0; layer < layout_.num_layers(); ++layer) {
    std::memcpy(data_.get() + layout_.BlockOffset(layer, dst), data_.get() + layout_.BlockOffset(layer, src),
                static_cast<size_t>(layout_.BlockBytes()));
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::kv
