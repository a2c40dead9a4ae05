// Helpers shared by the libFuzzer targets of tests/fuzz.
//
// Thread-safety: each target's LLVMFuzzerTestOneInput runs on one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kvmesh::fuzz {

// Consumes the input front to back: fixed-size values first, strings after.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return size_ == 0; }
  size_t remaining() const { return size_; }

  template <typename T>
  T Take() {
    T v{};
    const size_t n = size_ < sizeof(T) ? size_ : sizeof(T);
    std::memcpy(&v, data_, n);
    data_ += n;
    size_ -= n;
    return v;
  }

  // Up to `max` bytes, length-prefixed by one byte (so a string can end mid-input).
  std::string TakeString(size_t max = 255) {
    size_t n = Take<uint8_t>();
    if (n > max) n = max;
    if (n > size_) n = size_;
    std::string s(reinterpret_cast<const char*>(data_), n);
    data_ += n;
    size_ -= n;
    return s;
  }

  // Up to `max` bytes, length-prefixed by two bytes (little-endian).
  std::string TakeLongString(size_t max = 65535) {
    size_t n = Take<uint16_t>();
    if (n > max) n = max;
    if (n > size_) n = size_;
    std::string s(reinterpret_cast<const char*>(data_), n);
    data_ += n;
    size_ -= n;
    return s;
  }

  std::string Rest() {
    std::string s(reinterpret_cast<const char*>(data_), size_);
    data_ += size_;
    size_ = 0;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

}  // namespace kvmesh::fuzz
