// The name gtest shows for a test parameterized by a test model's directory
// ("tiny-llama" -> tiny_llama: '-' is not allowed in a test name).
#pragma once

#include <algorithm>
#include <string>

#include <gtest/gtest.h>

namespace kvmesh::engine {

inline std::string ModelParamName(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

}  // namespace kvmesh::engine
