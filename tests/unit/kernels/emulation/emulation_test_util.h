// Helpers shared by the kernels' host emulation tests (kernels_emulation_test): seeded
// inputs, the oracle backends and the GPU tests' relative tolerance. Included after
// host_emulation/prelude.h, like every other header of those tests.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "kv/kv_layout.h"

namespace kvmesh::kernels::emulation_test {

inline std::vector<float> RandomNormal(size_t n, uint32_t seed, float stddev = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// A pool laid out by `options` (which sizes it by num_blocks), its bytes random from `rng`,
// so a test sees that nothing outside what a kernel writes changes.
inline std::unique_ptr<kv::KvStorage> RandomKvStorage(const kv::KvLayoutOptions& options, std::mt19937& rng) {
  std::unique_ptr<kv::KvStorage> storage = kv::KvStorage::Create(options).value();
  for (int64_t i = 0; i < storage->size_bytes(); ++i) storage->data()[i] = static_cast<std::byte>(rng());
  return storage;
}

// The scalar reference backend, and the CPU backend where this CPU can run it.
inline std::vector<std::unique_ptr<backend::Backend>> Oracles() {
  std::vector<std::unique_ptr<backend::Backend>> oracles;
  oracles.push_back(backend::CreateReferenceBackend());
  if (auto cpu = backend::CreateCpuBackend({}); cpu.ok()) oracles.push_back(std::move(cpu).value());
  return oracles;
}

// |out - ref| <= tolerance * (1 + |ref|) element by element.
inline void ExpectRelativelyClose(const std::vector<float>& out, const std::vector<float>& ref, float tolerance) {
  ASSERT_EQ(out.size(), ref.size());
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_NEAR(out[i], ref[i], tolerance * (1 + std::fabs(ref[i]))) << "at " << i;
  }
}

}  // namespace kvmesh::kernels::emulation_test
