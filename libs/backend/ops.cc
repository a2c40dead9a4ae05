// What ops.h defines for every backend: the default Allocate, host memory aligned
// to 64 bytes (the reference and CPU backends use it as is).
#include "backend/ops.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvmesh::backend {
namespace {

inline constexpr std::align_val_t kHostAlignment{64};

// `size_bytes` of host memory from ::operator new, 64-byte aligned; owns it.
class HostBuffer final : public Backend::Buffer {
 public:
  HostBuffer(std::byte* data, int64_t size_bytes) : data_(data), size_bytes_(size_bytes) {}
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() override { ::operator delete(data_, kHostAlignment); }

  std::byte* data() const override { return data_; }
  int64_t size_bytes() const override { return size_bytes_; }

 private:
  std::byte* const data_;
  const int64_t size_bytes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend::Buffer>> Backend::Allocate(int64_t bytes, std::string_view what) {
  // Debian's Abseil has its own string_view, which StrCat takes.
  const absl::string_view for_what(what.data(), what.size());
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Allocate: ", bytes, " bytes for ", for_what));
  }
  // NOTE: 0 bytes still gets a distinct, non-null pointer (operator new's contract).
  void* data = ::operator new(static_cast<size_t>(bytes), kHostAlignment, std::nothrow);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("Allocate: no host memory for ", bytes, " bytes for ", for_what));
  }
  return std::make_unique<HostBuffer>(static_cast<std::byte*>(data), bytes);
}

}  // namespace kvmesh::backend
