#include "model/internal/bpe_model.h"

#include <queue>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/internal/utf8.h"

namespace kvmesh::model::internal {
namespace {

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool removed;
};

struct QueuedMerge {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  // std::priority_queue is a max-heap: "less" means later (higher rank, then right).
  bool operator<(const QueuedMerge& o) const {
    if (rank != o.rank) return rank > o.rank;
    return pos > o.pos;
  }
};

}  // namespace

absl::Status BpeModel::Init(absl::flat_hash_map<std::string, int32_t> vocab, BpeOptions options) {
  options_ = std::move(options);
  vocab_ = std::move(vocab);
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) {
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("negative id for token '", token, "'"));
    if (id > kMaxTokenId) {
      return absl::InvalidArgumentError(absl::StrCat("id ", id, " for token '", token, "' is past the largest token id ",
                                                     kMaxTokenId, " a vocabulary may use"));
    }
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  id_present_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : vocab_) {
    id_to_token_[id] = token;
    id_present_[id] = true;
  }
  if (options_.unk_token.has_value()) {
    auto it = vocab_.find(*options_.unk_token);
    if (it == vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unk_token '", *options_.unk_token, "' is not in the vocabulary"));
    }
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(absl::StrFormat("<0x%02X>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  for (int c = 0; c < 128; ++c) {
    auto it = vocab_.find(std::string(1, static_cast<char>(c)));
    ascii_ids_[c] = it == vocab_.end() ? -1 : it->second;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    absl::flat_hash_map<std::string, int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
    BpeOptions options) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  absl::Status status = model->Init(std::move(vocab), std::move(options));
  if (!status.ok()) return status;
  model->merges_.reserve(merges.size());
  const size_t prefix_len = model->options_.continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto l = model->vocab_.find(left);
    auto r = model->vocab_.find(right);
    if (l == model->vocab_.end() || r == model->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("merge ", rank, " ('", left, " ", right,
                                                     "') references a token that is not in the vocabulary"));
    }
    std::string joined = left;
    joined.append(right.size() >= prefix_len ? std::string_view(right).substr(prefix_len) : std::string_view(right));
    auto j = model->vocab_.find(joined);
    if (j == model->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge ", rank, " ('", left, " ", right, "') produces '", joined, "', not in the vocabulary"));
    }
    model->merges_.insert_or_assign(PairKey(l->second, r->second),
                                    std::make_pair(static_cast<int32_t>(rank), j->second));
  }
  return model;
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::CreateWithMerges(absl::flat_hash_map<std::string, int32_t> vocab,
                                                                     const std::vector<BpeMerge>& merges,
                                                                     BpeOptions options) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  absl::Status status = model->Init(std::move(vocab), std::move(options));
  if (!status.ok()) return status;
  model->merges_.reserve(merges.size());
  for (const BpeMerge& m : merges) {
    model->merges_.insert_or_assign(PairKey(m.left, m.right), std::make_pair(m.rank, m.new_id));
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(Sv(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_end() || !id_present_[id]) return nullptr;
  return &id_to_token_[id];
}

std::optional<int32_t> BpeModel::LookupPiece(std::string_view piece) const {
  if (piece.size() == 1 && static_cast<unsigned char>(piece[0]) < 128) {
    const int32_t id = ascii_ids_[static_cast<unsigned char>(piece[0])];
    if (id < 0) return std::nullopt;
    return id;
  }
  auto it = vocab_.find(Sv(piece));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (word.size() >= kMaxCachedWordBytes) {
    TokenizeUncached(word, ids);
    return;
  }
  CacheShard& shard = cache_[absl::Hash<absl::string_view>()(Sv(word)) % kCacheShards];
  {
    absl::MutexLock lock(&shard.mu);
    auto it = shard.words.find(Sv(word));
    if (it != shard.words.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  TokenizeUncached(word, ids);
  absl::MutexLock lock(&shard.mu);
  if (shard.words.size() < kMaxEntriesPerShard) {
    shard.words.emplace(std::string(word), std::vector<int32_t>(ids->begin() + first, ids->end()));
  }
}

void BpeModel::TokenizeUncached(std::string_view word, std::vector<int32_t>* ids) const {
  if (options_.ignore_merges) {
    if (auto it = vocab_.find(Sv(word)); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool plain = options_.continuing_subword_prefix.empty() && options_.end_of_word_suffix.empty();
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  const auto add = [&](int32_t id) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, index - 1, index + 1, false});
  };
  int32_t pending_unk = -1;  // a run of unknown characters not yet added, -1 if none
  std::string piece;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t len = Utf8LeadLength(static_cast<unsigned char>(word[pos]));
    const std::string_view ch = word.substr(pos, len);
    const bool is_first = pos == 0;
    const bool is_last = pos + len >= word.size();
    pos += len;
    std::optional<int32_t> id;
    if (plain) {
      id = LookupPiece(ch);
    } else {
      piece.clear();
      if (!is_first) piece += options_.continuing_subword_prefix;
      piece.append(ch);
      if (is_last) piece += options_.end_of_word_suffix;
      id = LookupPiece(piece);
    }
    if (id.has_value()) {
      if (pending_unk >= 0) {
        add(pending_unk);
        pending_unk = -1;
      }
      add(*id);
      continue;
    }
    if (options_.byte_fallback) {
      const std::string_view bytes = plain ? ch : std::string_view(piece);
      bool all = true;
      for (char b : bytes) all = all && byte_ids_[static_cast<unsigned char>(b)] >= 0;
      if (all) {
        for (char b : bytes) add(byte_ids_[static_cast<unsigned char>(b)]);
        continue;
      }
    }
    if (unk_id_.has_value()) {
      if (pending_unk >= 0 && !options_.fuse_unk) add(pending_unk);
      pending_unk = *unk_id_;
    }
    // NOTE: without an unk token `tokenizers` drops the character; so do we.
  }
  if (pending_unk >= 0) add(pending_unk);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  std::vector<QueuedMerge> heap_storage;
  heap_storage.reserve(symbols.size());
  std::priority_queue<QueuedMerge> queue(std::less<QueuedMerge>(), std::move(heap_storage));
  const auto find_merge = [&](int32_t left, int32_t right) -> const std::pair<int32_t, int32_t>* {
    auto it = merges_.find(PairKey(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const auto* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push(QueuedMerge{m->first, static_cast<int32_t>(i), m->second});
    }
  }
  while (!queue.empty()) {
    const QueuedMerge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.removed || cur.next < 0) continue;
    Symbol& right = symbols[cur.next];
    // Skip stale entries: the pair at this position has changed since it was queued.
    const auto* m = find_merge(cur.id, right.id);
    if (m == nullptr || m->second != top.new_id) continue;
    cur.id = top.new_id;
    right.removed = true;
    cur.next = right.next;
    if (cur.next >= 0) symbols[cur.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const auto* pm = find_merge(symbols[cur.prev].id, cur.id)) {
        queue.push(QueuedMerge{pm->first, cur.prev, pm->second});
      }
    }
    if (cur.next >= 0) {
      if (const auto* nm = find_merge(cur.id, symbols[cur.next].id)) {
        queue.push(QueuedMerge{nm->first, top.pos, nm->second});
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace kvmesh::model::internal
