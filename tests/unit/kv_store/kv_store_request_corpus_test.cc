// The kv_store_request fuzz target (tests/fuzz/kv_store_request_fuzz.cc) in the ordinary
// build: its committed corpus replays as a regression, and seeded random mutations of it
// run for a moment, so the target's invariants are checked by every ctest run and not
// only by tools/fuzz's clang build.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace kvmesh {
namespace {

std::vector<std::string> Corpus() {
  std::vector<std::string> inputs;
  for (const auto& entry :
       std::filesystem::directory_iterator(KVMESH_SOURCE_DIR "/tests/fuzz/corpus/kv_store_request")) {
    std::ifstream in(entry.path(), std::ios::binary);
    inputs.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return inputs;
}

void RunTarget(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

TEST(KvStoreRequestCorpusTest, EveryCommittedInputRunsClean) {
  const std::vector<std::string> corpus = Corpus();
  ASSERT_GE(corpus.size(), 4u);
  for (const std::string& input : corpus) RunTarget(input);
}

TEST(KvStoreRequestCorpusTest, SeededMutationsRunClean) {
  const std::vector<std::string> corpus = Corpus();
  std::mt19937 rng(33);  // seeded
  for (int i = 0; i < 3000; ++i) {
    std::string input = corpus[rng() % corpus.size()];
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips && !input.empty(); ++f) input[rng() % input.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) input.resize(rng() % (input.size() + 1));
    RunTarget(input);
  }
}

}  // namespace
}  // namespace kvmesh
