// StopStringMatcher: enforces OpenAI `stop` strings on streamed text.
//
// Generated text arrives in pieces (one per detokenized token). Consume() returns the
// text that is safe to send now and holds back any tail that could still grow into a
// stop string (or is an incomplete UTF-8 sequence). When a stop string matches, the
// text before it is released and the stop string itself and everything after are
// dropped (OpenAI semantics); the matcher is then stopped and ignores further input.
// When several stop strings match, the one that starts earliest wins (the longest
// among those starting at the same byte). Flush() releases the held tail at the end.
//
// Cost: O(piece + held) per stop string per call; the held tail is shorter than the
// longest stop string (plus at most 3 bytes of a partial UTF-8 character).
//
// Thread-safety: not thread-safe; one per generated sequence.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvmesh::http {

class StopStringMatcher {
 public:
  // Empty strings in `stop_strings` are ignored.
  explicit StopStringMatcher(std::vector<std::string> stop_strings);

  struct Result {
    std::string text;          // safe to emit now
    bool stopped = false;      // a stop string matched (now or earlier)
    int32_t stop_index = -1;   // which entry of stop_strings matched; -1 if none
  };

  // Feeds the next piece of generated text.
  Result Consume(std::string_view piece);

  // End of generation: releases the held-back tail (empty once stopped).
  std::string Flush();

  bool stopped() const { return stop_index_ >= 0; }
  int32_t stop_index() const { return stop_index_; }
  // Bytes currently held back.
  size_t held_bytes() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  std::vector<int32_t> original_index_;  // stops_[i] was stop_strings[original_index_[i]]
  std::string held_;
  int32_t stop_index_ = -1;
};

}  // namespace kvmesh::http
