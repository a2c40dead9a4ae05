// config.json parsing: any text either parses to a config or is a clean error.
#include <string>

#include "model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)kvmesh::model::ParseModelConfig(text, "config.json");
  return 0;
}
