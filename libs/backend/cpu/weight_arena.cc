#include "backend/cpu/weight_arena.h"

#include "core/huge_pages.h"

namespace kvmesh::backend::cpu {

namespace {

std::shared_ptr<std::byte> NewChunk(int64_t bytes) {
  HugePageMemory memory = AllocateHugePageMemory(bytes);
  if (memory == nullptr) return nullptr;
  return std::shared_ptr<std::byte>(memory.release(), HugePageFree());
}

}  // namespace

WeightArena::Block WeightArena::Allocate(int64_t bytes) {
  Block block;
  if (bytes <= 0) return block;
  const int64_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded > kChunkBytes / 2) {
    block.chunk_ = NewChunk(rounded);
    block.data_ = block.chunk_.get();
    return block;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (chunk_ == nullptr || used_ + rounded > chunk_size_) {
    chunk_ = NewChunk(kChunkBytes);
    if (chunk_ == nullptr) return block;
    chunk_size_ = static_cast<int64_t>(RoundUpToHugePages(kChunkBytes));
    used_ = 0;
  }
  block.chunk_ = chunk_;
  block.data_ = chunk_.get() + used_;
  used_ += rounded;
  return block;
}

}  // namespace kvmesh::backend::cpu
