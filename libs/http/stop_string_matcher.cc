#include "http/stop_string_matcher.h"

#include <algorithm>

namespace kvmesh::http {
namespace {

// Length of a trailing incomplete UTF-8 sequence of `s` (0 when `s` ends on a
// character boundary or with bytes that can never complete).
size_t IncompleteUtf8Tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 0;
    if ((c & 0xE0) == 0xC0) {
      need = 2;
    } else if ((c & 0xF0) == 0xE0) {
      need = 3;
    } else if ((c & 0xF8) == 0xF0) {
      need = 4;
    }
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings) {
  for (size_t i = 0; i < stop_strings.size(); ++i) {
    if (stop_strings[i].empty()) continue;
    stops_.push_back(std::move(stop_strings[i]));
    original_index_.push_back(static_cast<int32_t>(i));
  }
}

StopStringMatcher::Result StopStringMatcher::Consume(std::string_view piece) {
  Result result;
  if (stopped()) {
    result.stopped = true;
    result.stop_index = stop_index_;
    return result;
  }
  held_.append(piece);

  // 1. A full match: the earliest start wins, then the longest.
  size_t best_pos = std::string::npos;
  size_t best = 0;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = held_.find(stops_[i]);
    if (pos == std::string::npos) continue;
    if (pos < best_pos || (pos == best_pos && stops_[i].size() > stops_[best].size())) {
      best_pos = pos;
      best = i;
    }
  }
  if (best_pos != std::string::npos) {
    stop_index_ = original_index_[best];
    result.text = held_.substr(0, best_pos);
    result.stopped = true;
    result.stop_index = stop_index_;
    held_.clear();
    return result;
  }

  // 2. Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    const size_t max_len = std::min(stop.size() - 1, held_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (std::string_view(held_).substr(held_.size() - len) == std::string_view(stop).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  // 3. Never release half a UTF-8 character.
  hold = std::max(hold, IncompleteUtf8Tail(held_));

  result.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return result;
}

std::string StopStringMatcher::Flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace kvmesh::http
