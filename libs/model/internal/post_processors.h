// Post-processors of the `tokenizers` pipeline, applied by Encode when
// add_special_tokens is true. Only the single-sequence form is used here.
// Supported: TemplateProcessing, ByteLevel (offsets only: adds nothing),
// BertProcessing, RobertaProcessing and Sequence.
//
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace kvmesh::model::internal {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void Process(std::vector<int32_t>* ids) const = 0;
  // The first id the processor puts before the sequence, if any (a BOS).
  virtual std::optional<int32_t> leading_id() const { return std::nullopt; }
  virtual std::optional<int32_t> trailing_id() const { return std::nullopt; }
};

// Wraps the sequence: prefix ids, the sequence, suffix ids.
class WrapPostProcessor : public PostProcessor {
 public:
  WrapPostProcessor(std::vector<int32_t> prefix, std::vector<int32_t> suffix)
      : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  void Process(std::vector<int32_t>* ids) const override {
    ids->insert(ids->begin(), prefix_.begin(), prefix_.end());
    ids->insert(ids->end(), suffix_.begin(), suffix_.end());
  }
  std::optional<int32_t> leading_id() const override {
    if (prefix_.empty()) return std::nullopt;
    return prefix_.front();
  }
  std::optional<int32_t> trailing_id() const override {
    if (suffix_.empty()) return std::nullopt;
    return suffix_.back();
  }

 private:
  std::vector<int32_t> prefix_;
  std::vector<int32_t> suffix_;
};

class SequencePostProcessor : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void Process(std::vector<int32_t>* ids) const override {
    for (const auto& step : steps_) step->Process(ids);
  }
  std::optional<int32_t> leading_id() const override {
    for (const auto& step : steps_) {
      if (auto id = step->leading_id()) return id;
    }
    return std::nullopt;
  }
  std::optional<int32_t> trailing_id() const override {
    for (const auto& step : steps_) {
      if (auto id = step->trailing_id()) return id;
    }
    return std::nullopt;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

}  // namespace kvmesh::model::internal
