// Llama 3's rope_scaling (factor 8, low_freq_factor 1, high_freq_factor 4,
// original_max_position_embeddings 8192, theta 500000, head_dim 128): the configuration whose
// RopeInverseFrequencies() the RoPE kernel tests feed it (rope_llama3_test on the GPU, the
// host emulation test without one).
#pragma once

#include "model/model_config.h"

namespace kvmesh::kernels::test_util {

inline model::ModelConfig Llama3RopeConfig() {
  model::ModelConfig config;
  config.head_dim = 128;
  config.rope_theta = 500000.0f;
  config.max_position_embeddings = 131072;
  config.rope_scaling = {.type = model::RopeScalingType::kLlama3,
                         .factor = 8.0f,
                         .low_freq_factor = 1.0f,
                         .high_freq_factor = 4.0f,
                         .original_max_position_embeddings = 8192};
  return config;
}

}  // namespace kvmesh::kernels::test_util
