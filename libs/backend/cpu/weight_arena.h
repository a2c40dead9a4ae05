// WeightArena: the packed weights of one CPU backend, back to back in huge-page chunks
// (core/huge_pages.h), so that a decode step streams them over 2 MiB pages.
//
// Why not one allocation per weight: most Linear weights of a small model are below a
// huge page (SmolLM2-135M: 0.6 to 3.5 MiB each), so allocated one by one they sit on
// 4 KiB pages, and a batch-1 decode step is a stream over all of them.
//
// Thread-safety: Allocate may be called from any thread; a Block is owned by one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

namespace kvmesh::backend::cpu {

class WeightArena {
 public:
  // One chunk's size; a request above half of it gets a chunk of its own.
  static constexpr int64_t kChunkBytes = int64_t{32} << 20;
  static constexpr int64_t kAlignment = 4096;  // each block starts on its own page

  // A block of the arena; keeps its chunk alive (a chunk is freed with its last block).
  class Block {
   public:
    Block() = default;
    std::byte* data() const { return data_; }
    explicit operator bool() const { return data_ != nullptr; }

   private:
    friend class WeightArena;
    std::shared_ptr<std::byte> chunk_;
    std::byte* data_ = nullptr;
  };

  // `bytes` (> 0) of kAlignment-aligned memory, not zeroed; an empty Block when the
  // memory cannot be had.
  Block Allocate(int64_t bytes);

 private:
  std::mutex mu_;
  std::shared_ptr<std::byte> chunk_;  // guarded by mu_: the chunk being filled
  int64_t chunk_size_ = 0;            // guarded by mu_
  int64_t used_ = 0;                  // guarded by mu_
};

}  // namespace kvmesh::backend::cpu
