#include "serving/text_generation_stream.h"

#include <algorithm>

#include "http/stop_string_matcher.h"

namespace kvmesh::serving {

struct TextGenerationStream::Sample {
  Sample(const model::Tokenizer& tokenizer, bool skip_special_tokens, const std::vector<std::string>& stop)
      : detokenizer(tokenizer, skip_special_tokens), stop_matcher(stop) {}
  model::IncrementalDetokenizer detokenizer;
  http::StopStringMatcher stop_matcher;  // holds back text that may begin a stop string
  std::string text;      // everything emitted
  int32_t num_tokens = 0;
  std::optional<std::string> finish_reason;
  bool engine_finished = false;
};

TextGenerationStream::TextGenerationStream(const model::Tokenizer& tokenizer, const TextGenerationOptions& options)
    : tokenizer_(tokenizer), options_(options) {
  std::erase_if(options_.stop, [](const std::string& s) { return s.empty(); });
  for (int32_t i = 0; i < std::max(1, options_.n); ++i) {
    samples_.push_back(std::make_unique<Sample>(tokenizer_, options_.skip_special_tokens, options_.stop));
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
    auto on_stop = [&](const http::StopStringMatcher::Result& r) {
      if (options_.include_stop_str_in_output) delta.text += options_.stop[r.stop_index];
      delta.stop_string = options_.stop[r.stop_index];
      s.finish_reason = "stop";
    };
    for (size_t t = 0; t < c.new_token_ids.size() && !s.finish_reason; ++t) {
      ++s.num_tokens;
      delta.token_ids.push_back(c.new_token_ids[t]);
      if (t < c.new_logprobs.size()) delta.logprobs.push_back(c.new_logprobs[t]);
      const http::StopStringMatcher::Result r = s.stop_matcher.Consume(s.detokenizer.Append(c.new_token_ids[t]));
      delta.text += r.text;
      if (r.stopped) on_stop(r);  // a stop string ends the sample right there
    }
    if (!s.finish_reason && c.finished()) {
      // The engine ended the sample: whatever the detokenizer and matcher hold is final.
      const http::StopStringMatcher::Result r = s.stop_matcher.Consume(s.detokenizer.Flush());
      delta.text += r.text;
      if (r.stopped) {
        on_stop(r);
      } else {
        delta.text += s.stop_matcher.Flush();
        s.finish_reason = std::string(engine::CompletionFinishReasonName(c.finish_reason));
      }
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
