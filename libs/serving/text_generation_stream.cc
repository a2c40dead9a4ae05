#include "serving/text_generation_stream.h"

#include <algorithm>

namespace kvmesh::serving {

struct TextGenerationStream::Sample {
  Sample(const model::Tokenizer& tokenizer, bool skip_special_tokens) : detokenizer(tokenizer, skip_special_tokens) {}
  model::IncrementalDetokenizer detokenizer;
  std::string held;      // decoded text not yet emitted: it may begin a stop string
  std::string text;      // everything emitted
  int32_t num_tokens = 0;
  std::optional<std::string> finish_reason;
  bool engine_finished = false;
};

namespace {

// Length of the longest suffix of `text` that is a proper prefix of some stop string.
size_t HoldBackLength(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& stop : stops) {
    for (size_t len = std::min(stop.size() - 1, text.size()); len > hold; --len) {
      if (text.compare(text.size() - len, len, stop, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

}  // namespace

TextGenerationStream::TextGenerationStream(const model::Tokenizer& tokenizer, const TextGenerationOptions& options)
    : tokenizer_(tokenizer), options_(options) {
  std::erase_if(options_.stop, [](const std::string& s) { return s.empty(); });
  for (int32_t i = 0; i < std::max(1, options_.n); ++i) {
    samples_.push_back(std::make_unique<Sample>(tokenizer_, options_.skip_special_tokens));
  }
}

TextGenerationStream::~TextGenerationStream() = default;

std::vector<SampleDelta> TextGenerationStream::Consume(const engine::RequestOutput& output) {
  num_prompt_tokens_ = output.num_prompt_tokens;
  num_cached_prompt_tokens_ = output.num_cached_prompt_tokens;
  std::vector<SampleDelta> deltas;
  for (const engine::CompletionOutput& c : output.outputs) {
    if (c.index < 0 || c.index >= static_cast<int32_t>(samples_.size())) continue;
    Sample& s = *samples_[c.index];
    if (s.finish_reason) continue;  // finished by a stop string: later tokens are dropped
    SampleDelta delta;
    delta.index = c.index;
    for (size_t t = 0; t < c.new_token_ids.size(); ++t) {
      s.held += s.detokenizer.Append(c.new_token_ids[t]);
      ++s.num_tokens;
      delta.token_ids.push_back(c.new_token_ids[t]);
      if (t < c.new_logprobs.size()) delta.logprobs.push_back(c.new_logprobs[t]);
      // 1. A stop string in the held text ends the sample right there.
      size_t best = std::string::npos, best_len = 0;
      for (const std::string& stop : options_.stop) {
        const size_t pos = s.held.find(stop);
        if (pos != std::string::npos && (best == std::string::npos || pos < best)) {
          best = pos;
          best_len = stop.size();
        }
      }
      if (best != std::string::npos) {
        delta.text += s.held.substr(0, best + (options_.include_stop_str_in_output ? best_len : 0));
        s.held.clear();
        s.finish_reason = "stop";
        break;
      }
    }
    if (!s.finish_reason && c.finished()) {
      // 2. The engine ended the sample: everything left is final.
      s.held += s.detokenizer.Flush();
      delta.text += s.held;
      s.held.clear();
      s.finish_reason = std::string(engine::CompletionFinishReasonName(c.finish_reason));
    } else if (!s.finish_reason) {
      // 3. Emit all but a suffix that could still grow into a stop string.
      const size_t hold = HoldBackLength(s.held, options_.stop);
      delta.text += s.held.substr(0, s.held.size() - hold);
      s.held.erase(0, s.held.size() - hold);
    }
    if (c.finished()) s.engine_finished = true;
    s.text += delta.text;
    delta.finish_reason = s.finish_reason;
    deltas.push_back(std::move(delta));
  }
  if (output.finished) {
    // The request ended (e.g. abort or error) for samples that reported nothing.
    for (size_t i = 0; i < samples_.size(); ++i) {
      Sample& s = *samples_[i];
      s.engine_finished = true;
      if (s.finish_reason) continue;
      SampleDelta delta;
      delta.index = static_cast<int32_t>(i);
      s.finish_reason = output.status.ok() ? "abort" : "error";
      delta.finish_reason = s.finish_reason;
      deltas.push_back(std::move(delta));
    }
    std::sort(deltas.begin(), deltas.end(), [](const SampleDelta& a, const SampleDelta& b) { return a.index < b.index; });
  }
  return deltas;
}

bool TextGenerationStream::all_finished() const {
  return std::all_of(samples_.begin(), samples_.end(), [](const auto& s) { return s->finish_reason.has_value(); });
}

bool TextGenerationStream::needs_abort() const {
  return std::any_of(samples_.begin(), samples_.end(),
                     [](const auto& s) { return s->finish_reason.has_value() && !s->engine_finished; }) &&
         all_finished();
}

int32_t TextGenerationStream::num_completion_tokens() const {
  int32_t n = 0;
  for (const auto& s : samples_) n += s->num_tokens;
  return n;
}

const std::string& TextGenerationStream::text(int32_t index) const { return samples_.at(index)->text; }

}  // namespace kvmesh::serving
