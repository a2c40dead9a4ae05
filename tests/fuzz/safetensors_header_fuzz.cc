// The safetensors loader on arbitrary files: an 8-byte header length, a JSON header,
// a data section. Every tensor it accepts must be readable (Get) within the file.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // NOTE: SafetensorsFile maps a path, so the input goes through a file of its own.
  static const std::string path = "/tmp/kvmesh-fuzz-" + std::to_string(getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
  auto file = kvmesh::model::SafetensorsFile::Open(path);
  if (file.ok()) {
    for (const kvmesh::model::SafetensorInfo& t : (*file)->tensors()) {
      auto view = (*file)->Get(t.name);
      if (!view.ok()) __builtin_trap();  // listed but not readable: a broken invariant
    }
  }
  return 0;
}
