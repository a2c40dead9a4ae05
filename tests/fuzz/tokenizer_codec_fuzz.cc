// Encode and decode with the embedded tiny model's tokenizer: arbitrary bytes (invalid
// UTF-8 included) encode; arbitrary ids (out of the vocabulary included) decode; the
// incremental detokenizer agrees with Decode.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "model/tokenizer.h"

namespace {

const kvmesh::model::Tokenizer& Tiny() {
  static const std::unique_ptr<kvmesh::model::Tokenizer> tokenizer = [] {
    const char* dir = std::getenv("KVMESH_FUZZ_MODEL_DIR");
    auto t = kvmesh::model::Tokenizer::FromDirectory(dir != nullptr ? dir : KVMESH_TINY_MODEL_DIR);
    if (!t.ok()) std::abort();  // the harness is misconfigured, not a finding
    return *std::move(t);
  }();
  return *tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kvmesh::model::Tokenizer& tok = Tiny();
  kvmesh::fuzz::Input in(data, size);
  const uint8_t mode = in.Take<uint8_t>();
  if (mode & 1) {
    const std::string text = in.Rest();
    const std::vector<int32_t> ids = tok.Encode(text, (mode & 2) != 0);
    (void)tok.Decode(ids, (mode & 4) != 0);
  } else {
    // Mostly ids in the vocabulary, a few just outside it on either side.
    const uint32_t span = static_cast<uint32_t>(tok.vocab_size()) + 16;
    std::vector<int32_t> ids;
    bool all_in_vocabulary = true;
    while (in.remaining() >= sizeof(uint32_t) && ids.size() < 4096) {
      const int32_t id = static_cast<int32_t>(in.Take<uint32_t>() % span) - 8;
      all_in_vocabulary = all_in_vocabulary && id >= 0 && id < tok.vocab_size();
      ids.push_back(id);
    }
    const std::string all = tok.Decode(ids, (mode & 4) != 0);
    if (!all_in_vocabulary) return 0;
    kvmesh::model::IncrementalDetokenizer detok(tok, (mode & 4) != 0);
    std::string pieces;
    for (const int32_t id : ids) pieces += detok.Append(id);
    pieces += detok.Flush();
    if (pieces != all) __builtin_trap();  // the documented contract of IncrementalDetokenizer
  }
  return 0;
}
