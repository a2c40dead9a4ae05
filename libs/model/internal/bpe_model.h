// BpeModel: the `tokenizers` BPE model. A word is split into characters (with
// the continuing-subword prefix / end-of-word suffix), characters missing from
// the vocabulary become <0xNN> byte tokens (byte_fallback) or the unknown token
// (fused when fuse_unk), then adjacent pairs merge lowest rank first, leftmost
// first on ties: a priority queue over a linked list of symbols, O(n log n).
// Short words' results are cached.
//
// Thread-safety: immutable after Create except for the internally locked cache;
// Tokenize may run on many threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvmesh::model::internal {

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

// A merge (left, right) -> new token, by token id; rank orders merges (lower first).
struct BpeMerge {
  int32_t left;
  int32_t right;
  int32_t rank;
  int32_t new_id;
};

class BpeModel {
 public:
  // `vocab` maps token -> id. `merges` are "left right" token strings in rank
  // order. InvalidArgument when a merge names a token (or a join) not in the
  // vocabulary, or the unk token is missing.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      absl::flat_hash_map<std::string, int32_t> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);
  // Merges given directly by id (SentencePiece models derive them from scores).
  static absl::StatusOr<std::unique_ptr<BpeModel>> CreateWithMerges(
      absl::flat_hash_map<std::string, int32_t> vocab, const std::vector<BpeMerge>& merges, BpeOptions options);

  // Appends the ids of `word` (valid UTF-8) to `ids`.
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  // The id table is dense (indexed by id), so one token with id 3e9 would cost
  // ~100 GB (found by tools/fuzz tokenizer_json). The largest real vocabularies
  // (Gemma 3, NLLB) have ~262K ids; 2^22 leaves 16x headroom and caps the table
  // at 4M entries.
  static constexpr int32_t kMaxTokenId = (1 << 22) - 1;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // nullptr when `id` is not in the vocabulary.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id.
  int32_t id_end() const { return static_cast<int32_t>(id_to_token_.size()); }
  const absl::flat_hash_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  BpeModel() = default;
  absl::Status Init(absl::flat_hash_map<std::string, int32_t> vocab, BpeOptions options);
  void TokenizeUncached(std::string_view word, std::vector<int32_t>* ids) const;
  std::optional<int32_t> LookupPiece(std::string_view piece) const;

  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  BpeOptions options_;
  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> id_present_;
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // pair -> (rank, new_id)
  std::optional<int32_t> unk_id_;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> ids, -1 if absent
  std::array<int32_t, 128> ascii_ids_{};  // single ASCII chars (no prefix/suffix), -1 if absent

  // Word cache (words shorter than kMaxCachedWordBytes), sharded to limit contention.
  static constexpr size_t kMaxCachedWordBytes = 64;
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kMaxEntriesPerShard = 4096;
  struct CacheShard {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> words ABSL_GUARDED_BY(mu);
  };
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace kvmesh::model::internal
