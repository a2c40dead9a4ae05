#include "kv/checksum.h"

#if defined(__x86_64__)
#define XXH_DISPATCH_DISABLE_REPLACE  // the calls below name the dispatched functions
#include <xxh_x86dispatch.h>
#define KVMESH_XXH3_64 XXH3_64bits_dispatch
#define KVMESH_XXH3_64_UPDATE XXH3_64bits_update_dispatch
#else  // other CPUs: libxxhash's own build (it dispatches only on x86)
#define KVMESH_XXH3_64 XXH3_64bits
#define KVMESH_XXH3_64_UPDATE XXH3_64bits_update
#endif

namespace kvmesh::kv {

uint64_t Checksum(std::span<const std::byte> bytes) { return KVMESH_XXH3_64(bytes.data(), bytes.size()); }

ChecksumStream::ChecksumStream() { XXH3_64bits_reset(&state_); }

void ChecksumStream::Update(std::span<const std::byte> bytes) {
  KVMESH_XXH3_64_UPDATE(&state_, bytes.data(), bytes.size());
}

uint64_t ChecksumStream::Digest() const { return XXH3_64bits_digest(&state_); }

}  // namespace kvmesh::kv
