// TensorView: a non-owning, typed, strided view of memory (host or device).
//
// Shapes are listed outermost first; strides count elements, not bytes. A view
// never owns its memory: whoever made it (a mmap'd safetensors file, a packed
// weight, an activation buffer) must outlive it.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"

namespace kvmesh {

inline constexpr int kMaxTensorRank = 6;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  std::array<int64_t, kMaxTensorRank> shape{};
  std::array<int64_t, kMaxTensorRank> strides{};

  // A contiguous (row-major) view.
  static TensorView Contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape) {
    TensorView v;
    v.data = data;
    v.dtype = dtype;
    v.rank = static_cast<int>(shape.size());
    int i = 0;
    for (int64_t d : shape) v.shape[i++] = d;
    int64_t stride = 1;
    for (int d = v.rank - 1; d >= 0; --d) {
      v.strides[d] = stride;
      stride *= v.shape[d];
    }
    return v;
  }

  int64_t dim(int i) const { return shape[i < 0 ? rank + i : i]; }
  int64_t num_elements() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  int64_t num_bytes() const { return num_elements() * DTypeSize(dtype); }
  bool is_contiguous() const {
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      if (shape[d] != 1 && strides[d] != stride) return false;
      stride *= shape[d];
    }
    return true;
  }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data);
  }
  // "[2, 3] bf16"
  std::string DebugString() const {
    std::string s = "[";
    for (int i = 0; i < rank; ++i) {
      if (i) s += ", ";
      s += std::to_string(shape[i]);
    }
    s += "] ";
    s += DTypeName(dtype);
    return s;
  }
};

}  // namespace kvmesh
