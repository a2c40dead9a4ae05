// tokenizer_bench: single-thread Encode/Decode throughput (MB/s of UTF-8 text)
// for the GPT-2, Mistral and tiny-model tokenizers, next to Hugging Face
// `tokenizers` measured by tools/tokenizer-bench-hf on the same text:
//
//   tools/tokenizer-bench-hf --out /tmp/tokbench
//   build/tests/bench/tokenizer_bench --text /tmp/tokbench/text.txt --hf /tmp/tokbench/hf.json
//
// Without --text it synthesises its own text (no HF comparison then).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace {

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

std::string SynthesiseText(size_t bytes) {
  static const char* kWords[] = {"the", "of", "and", "to", "in", "is", "model", "cache", "block", "serving",
                                 "request", "latency", "kernel", "attention", "layer", "batch", "sequence"};
  std::mt19937 rng(1);
  std::string s;
  while (s.size() < bytes) {
    s += kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
    s += (rng() % 12 == 0) ? ".\n" : " ";
  }
  return s;
}

// The text cut into ~16 KiB documents at UTF-8 character boundaries.
std::vector<std::string> Documents(const std::string& text) {
  std::vector<std::string> docs;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = std::min(text.size(), pos + 16384);
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    docs.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return docs;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string text_path, hf_path;
  std::string data_dir = KVMESH_TOKENIZER_DATA_DIR;  // tests/data/tokenizers of this checkout
  std::string tiny_dir = KVMESH_TINY_MODEL_DIR;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--text")) text_path = argv[i + 1];
    if (!std::strcmp(argv[i], "--hf")) hf_path = argv[i + 1];
    if (!std::strcmp(argv[i], "--data-dir")) data_dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--tiny-model-dir")) tiny_dir = argv[i + 1];
  }
  std::string text;
  if (text_path.empty() || !ReadFile(text_path, &text)) text = SynthesiseText(4 << 20);
  nlohmann::json hf;
  std::string hf_text;
  if (!hf_path.empty() && ReadFile(hf_path, &hf_text)) hf = nlohmann::json::parse(hf_text, nullptr, false);
  const std::vector<std::string> docs = Documents(text);
  std::printf("text: %.2f MB in %zu documents\n", text.size() / 1e6, docs.size());

  const std::pair<std::string, std::string> tokenizers[] = {
      {"gpt2", data_dir + "/gpt2/tokenizer.json"},
      {"mistral-7b", data_dir + "/mistral-7b/tokenizer.json"},
      {"tiny-llama", tiny_dir + "/tokenizer.json"},
  };
  for (const auto& [name, path] : tokenizers) {
    std::string json;
    if (!ReadFile(path, &json)) {
      std::printf("%-11s skipped (%s missing)\n", name.c_str(), path.c_str());
      continue;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto tok = kvmesh::model::Tokenizer::FromJson(json, path);
    auto t1 = std::chrono::steady_clock::now();
    if (!tok.ok()) {
      std::printf("%-11s load failed: %s\n", name.c_str(), std::string(tok.status().message()).c_str());
      continue;
    }
    std::vector<std::vector<int32_t>> encoded(docs.size());
    double best_encode = 1e9, best_cold = 0;
    size_t tokens = 0;
    for (int rep = 0; rep < 3; ++rep) {
      auto a = std::chrono::steady_clock::now();
      tokens = 0;
      for (size_t i = 0; i < docs.size(); ++i) {
        encoded[i] = (*tok)->Encode(docs[i], false);
        tokens += encoded[i].size();
      }
      const double s = Seconds(a, std::chrono::steady_clock::now());
      if (rep == 0) best_cold = s;
      best_encode = std::min(best_encode, s);
    }
    double best_decode = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      auto a = std::chrono::steady_clock::now();
      size_t bytes = 0;
      for (const auto& ids : encoded) bytes += (*tok)->Decode(ids, false).size();
      best_decode = std::min(best_decode, Seconds(a, std::chrono::steady_clock::now()));
      if (bytes == 0) std::printf("(empty decode)\n");
    }
    const double mb = text.size() / 1e6;
    std::printf("%-11s load %.0f ms | encode %.2f MB/s (first pass %.2f MB/s, %zu tokens) | decode %.2f MB/s",
                name.c_str(), Seconds(t0, t1) * 1e3, mb / best_encode, mb / best_cold, tokens, mb / best_decode);
    if (hf.is_object() && hf.contains(name)) {
      const double hf_mbs = hf[name]["encode_mb_per_s"].get<double>();
      const size_t hf_tokens = hf[name]["tokens"].get<size_t>();
      std::printf(" | HF tokenizers %.2f MB/s -> %.2fx%s", hf_mbs, (mb / best_encode) / hf_mbs,
                  hf_tokens == tokens ? "" : " (TOKEN COUNT DIFFERS)");
    }
    std::printf("\n");
  }
  return 0;
}
