#include "kv_store/store_data_plane.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvmesh::kv_store {

absl::StatusOr<kv::KvLayout> StoreSlotLayout(int64_t block_bytes, int32_t num_blocks) {
  if (block_bytes <= 0 || block_bytes % 2 != 0 || block_bytes / 2 > INT32_MAX || num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("store slot layout: ", num_blocks, " blocks of ", block_bytes, " bytes (even, positive)"));
  }
  return kv::KvLayout::Create({.num_layers = 1,
                               .num_kv_heads = 1,
                               .head_dim = static_cast<int32_t>(block_bytes / 2),
                               .block_size_tokens = 1,
                               .dtype = DType::kInt8,
                               .num_blocks = num_blocks});
}

int32_t KvStoreDataPlane::BlockOf(std::span<const std::byte> bytes) const {
  if (!enabled() || static_cast<int64_t>(bytes.size()) != block_bytes || bytes.data() < base) return -1;
  const int64_t offset = bytes.data() - base;
  if (offset % block_bytes != 0 || offset / block_bytes >= num_blocks) return -1;
  return static_cast<int32_t>(offset / block_bytes);
}

absl::StatusOr<KvStoreDataPlane> RegisterDataPlane(kv::KvTransport& transport, std::byte* base, int64_t block_bytes,
                                                   int32_t num_blocks) {
  if (base == nullptr) return absl::InvalidArgumentError("data plane: no memory");
  KVMESH_ASSIGN_OR_RETURN(const kv::KvLayout layout, StoreSlotLayout(block_bytes, num_blocks));
  KVMESH_ASSIGN_OR_RETURN(const kv::KvPoolHandle pool, transport.RegisterPool(base, layout));
  return KvStoreDataPlane{
      .transport = &transport, .pool = pool, .base = base, .block_bytes = block_bytes, .num_blocks = num_blocks};
}

}  // namespace kvmesh::kv_store
