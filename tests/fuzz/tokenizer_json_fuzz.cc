// tokenizer.json loading: any text loads or is a clean error; a tokenizer that loads
// must encode and decode without crashing.
#include <string>

#include "model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto tokenizer = kvmesh::model::Tokenizer::FromJson(text, "tokenizer.json");
  if (!tokenizer.ok()) return 0;
  const std::vector<int32_t> ids = (*tokenizer)->Encode("Hello, world! 123 ünïcode", true);
  (void)(*tokenizer)->Decode(ids, false);
  (void)(*tokenizer)->Decode(ids, true);
  return 0;
}
