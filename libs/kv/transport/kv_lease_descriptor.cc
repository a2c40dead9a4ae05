#include "kv/transport/kv_lease_descriptor.h"

#include <xxhash.h>

#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kv/kv_layout.h"

namespace kvmesh::kv {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'L', 'D'};
constexpr uint16_t kVersion = 2;  // 2: receiver_pid, host_identity

template <typename T>
void Put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // the hosts we build for are little-endian
  out.append(bytes, sizeof(T));
}

void PutBytes(std::string& out, std::string_view bytes) {
  Put<uint32_t>(out, static_cast<uint32_t>(bytes.size()));
  out.append(bytes);
}

// Reads fields off the front of a byte string; every read checks what is left.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : rest_(bytes) {}

  template <typename T>
  absl::Status Get(const char* field, T& value) {
    if (rest_.size() < sizeof(T)) return Truncated(field);
    std::memcpy(&value, rest_.data(), sizeof(T));
    rest_.remove_prefix(sizeof(T));
    return absl::OkStatus();
  }
  absl::Status GetBytes(const char* field, int64_t max_bytes, std::string& value) {
    uint32_t n = 0;
    KVMESH_RETURN_IF_ERROR(Get(field, n));
    if (n > max_bytes) return absl::InvalidArgumentError(absl::StrCat("lease descriptor: ", field, " of ", n, " bytes"));
    if (rest_.size() < n) return Truncated(field);
    value.assign(rest_.data(), n);
    rest_.remove_prefix(n);
    return absl::OkStatus();
  }
  size_t left() const { return rest_.size(); }

 private:
  static absl::Status Truncated(const char* field) {
    return absl::InvalidArgumentError(absl::StrCat("lease descriptor: truncated at ", field));
  }
  std::string_view rest_;
};

}  // namespace

std::string EncodeKvLeaseDescriptor(const KvLeaseDescriptor& d) {
  std::string out(kMagic, sizeof(kMagic));
  Put<uint16_t>(out, kVersion);
  Put<uint64_t>(out, d.lease_token);
  Put<int32_t>(out, d.spec.num_layers);
  Put<int32_t>(out, d.spec.num_kv_heads);
  Put<int32_t>(out, d.spec.head_dim);
  Put<int32_t>(out, d.spec.block_size_tokens);
  Put<uint8_t>(out, static_cast<uint8_t>(d.spec.dtype));
  Put<int64_t>(out, d.spec.block_bytes);
  Put<int32_t>(out, d.pool_num_blocks);
  Put<uint64_t>(out, d.remote_base);
  Put<uint32_t>(out, static_cast<uint32_t>(d.block_ids.size()));
  for (const BlockId id : d.block_ids) Put<int32_t>(out, id.value);
  PutBytes(out, d.remote_key);
  PutBytes(out, d.worker_address);
  Put<int32_t>(out, d.receiver_pid);
  PutBytes(out, d.host_identity);
  Put<uint64_t>(out, XXH64(out.data(), out.size(), 0));
  return out;
}

absl::StatusOr<KvLeaseDescriptor> DecodeKvLeaseDescriptor(std::string_view bytes) {
  if (bytes.size() < sizeof(kMagic) + sizeof(uint16_t) + sizeof(uint64_t) ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError("lease descriptor: not a KV lease descriptor (bad magic)");
  }
  uint64_t checksum = 0;
  std::memcpy(&checksum, bytes.data() + bytes.size() - sizeof(uint64_t), sizeof(uint64_t));
  const std::string_view body = bytes.substr(0, bytes.size() - sizeof(uint64_t));
  if (XXH64(body.data(), body.size(), 0) != checksum) {
    return absl::InvalidArgumentError("lease descriptor: checksum mismatch (corrupt or altered)");
  }
  Reader r(body.substr(sizeof(kMagic)));
  uint16_t version = 0;
  KVMESH_RETURN_IF_ERROR(r.Get("version", version));
  if (version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("lease descriptor: version ", version, ", this build reads ", kVersion));
  }
  KvLeaseDescriptor d;
  uint8_t dtype = 0;
  uint32_t num_ids = 0;
  KVMESH_RETURN_IF_ERROR(r.Get("lease_token", d.lease_token));
  KVMESH_RETURN_IF_ERROR(r.Get("num_layers", d.spec.num_layers));
  KVMESH_RETURN_IF_ERROR(r.Get("num_kv_heads", d.spec.num_kv_heads));
  KVMESH_RETURN_IF_ERROR(r.Get("head_dim", d.spec.head_dim));
  KVMESH_RETURN_IF_ERROR(r.Get("block_size_tokens", d.spec.block_size_tokens));
  KVMESH_RETURN_IF_ERROR(r.Get("dtype", dtype));
  KVMESH_RETURN_IF_ERROR(r.Get("block_bytes", d.spec.block_bytes));
  KVMESH_RETURN_IF_ERROR(r.Get("pool_num_blocks", d.pool_num_blocks));
  KVMESH_RETURN_IF_ERROR(r.Get("remote_base", d.remote_base));
  KVMESH_RETURN_IF_ERROR(r.Get("num_block_ids", num_ids));
  if (num_ids > kMaxLeaseBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("lease descriptor: ", num_ids, " block ids"));
  }
  if (r.left() < static_cast<size_t>(num_ids) * sizeof(int32_t)) {
    return absl::InvalidArgumentError("lease descriptor: truncated at block_ids");
  }
  d.block_ids.resize(num_ids);
  for (BlockId& id : d.block_ids) KVMESH_RETURN_IF_ERROR(r.Get("block_ids", id.value));
  KVMESH_RETURN_IF_ERROR(r.GetBytes("remote_key", kMaxLeaseKeyBytes, d.remote_key));
  KVMESH_RETURN_IF_ERROR(r.GetBytes("worker_address", kMaxLeaseKeyBytes, d.worker_address));
  KVMESH_RETURN_IF_ERROR(r.Get("receiver_pid", d.receiver_pid));
  KVMESH_RETURN_IF_ERROR(r.GetBytes("host_identity", kMaxLeaseKeyBytes, d.host_identity));
  if (r.left() != 0) return absl::InvalidArgumentError(absl::StrCat("lease descriptor: ", r.left(), " trailing bytes"));

  // The receiver's layout must describe a real pool before anything is computed from it.
  d.spec.dtype = static_cast<DType>(dtype);
  const KvLayoutOptions shape{.num_layers = d.spec.num_layers,
                              .num_kv_heads = d.spec.num_kv_heads,
                              .head_dim = d.spec.head_dim,
                              .block_size_tokens = d.spec.block_size_tokens,
                              .dtype = d.spec.dtype,
                              .num_blocks = d.pool_num_blocks};
  if (d.spec.num_layers <= 0 || d.spec.num_kv_heads <= 0 || d.spec.head_dim <= 0 || d.spec.block_size_tokens <= 0 ||
      d.pool_num_blocks <= 0 || dtype > static_cast<uint8_t>(DType::kInt8)) {
    return absl::InvalidArgumentError("lease descriptor: the KV layout has a non-positive dimension or a bad dtype");
  }
  if (KvBlockBytes(shape) != d.spec.block_bytes || !KvLayout::Create(shape).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("lease descriptor: block_bytes ", d.spec.block_bytes,
                                                   " does not match its layout (", KvBlockBytes(shape), ")"));
  }
  absl::flat_hash_set<int32_t> seen;
  for (const BlockId id : d.block_ids) {
    if (id.value < 0 || id.value >= d.pool_num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("lease descriptor: block id ", id.value, " outside the pool's ", d.pool_num_blocks));
    }
    if (!seen.insert(id.value).second) {
      return absl::InvalidArgumentError(absl::StrCat("lease descriptor: block id ", id.value, " repeated"));
    }
  }
  if (d.receiver_pid < 0) return absl::InvalidArgumentError("lease descriptor: negative receiver pid");
  if (d.remote_key.empty() || d.worker_address.empty()) {
    return absl::InvalidArgumentError("lease descriptor: empty remote key or worker address");
  }
  return d;
}

}  // namespace kvmesh::kv
