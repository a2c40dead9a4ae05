#include "core/huge_pages.h"

#include <sys/mman.h>

namespace kvmesh {

HugePageMemory AllocateHugePageMemory(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  const size_t rounded = RoundUpToHugePages(bytes);
  HugePageMemory memory(static_cast<std::byte*>(std::aligned_alloc(kHugePageBytes, rounded)));
  // NOTE: advisory: without THP (or with it off) this is a no-op.
  if (memory != nullptr) (void)::madvise(memory.get(), rounded, MADV_HUGEPAGE);
  return memory;
}

}  // namespace kvmesh
