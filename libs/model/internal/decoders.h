// Decoders of the `tokenizers` pipeline: each rewrites the list of token
// strings; the decoded text is the concatenation of the final list. Supported:
// ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence.
//
// Thread-safety: immutable after construction.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/internal/pre_tokenizers.h"
#include "model/internal/regex.h"

namespace kvmesh::model::internal {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& step : steps_) step->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

// Maps the stand-in characters back to bytes and joins everything into one
// string, invalid UTF-8 becoming U+FFFD (a token with a character outside the
// table contributes its own UTF-8 bytes).
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override;
};

// The replacement character becomes a space; in the first token it is dropped
// unless the prepend scheme is "never".
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, PrependScheme scheme)
      : replacement_(std::move(replacement)), scheme_(scheme) {}
  void DecodeChain(std::vector<std::string>* tokens) const override;

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override;

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

// Runs of <0xNN> tokens become their bytes when those are valid UTF-8, else one
// U+FFFD per byte.
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override;
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override;
};

// Removes up to `start` leading and `stop` trailing `content` characters of each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, int start, int stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override;

 private:
  std::string content_;  // one character
  int start_;
  int stop_;
};

}  // namespace kvmesh::model::internal
