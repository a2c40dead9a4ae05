// The built-in filters, tests, methods (str, dict) and global functions of the
// jinja2 subset, with jinja2's semantics for attribute and item lookup
// (getattr then getitem for `a.b`, getitem then getattr for `a['b']`; a miss
// is Undefined, an operation on Undefined is an error).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/jinja/value.h"

namespace kvmesh::model::jinja {

// The most bytes one width, padding or repetition may produce ('x' * n, indent(n),
// center(n), tojson(indent=n)): no chat template needs more, and a larger one is a
// clear error instead of an allocation without bound.
inline constexpr int64_t kMaxGeneratedBytes = int64_t{16} << 20;

// Reads a call's arguments by position or keyword, as a Python signature would.
class ArgReader {
 public:
  ArgReader(CallArgs& args, std::string function) : args_(args), function_(std::move(function)) {}
  // The `index`-th positional argument or keyword `name`; `fallback` if neither.
  Value Get(size_t index, const char* name, Value fallback = Value());
  // InvalidArgument for positional arguments past what Get read, or unknown keywords.
  absl::Status Done() const;
  const std::string& function() const { return function_; }

 private:
  CallArgs& args_;
  std::string function_;
  size_t max_positional_ = 0;
  std::vector<std::string> known_;
};

bool IsKnownFilter(const std::string& name);
bool IsKnownTest(const std::string& name);

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& input, CallArgs& args);
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& input, CallArgs& args);

// `obj.name` and `obj[key]`. InvalidArgument when `obj` is Undefined.
absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name);
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);

// What `for x in v` visits: list items, dict keys, string characters; nothing
// for Undefined. InvalidArgument for values that are not iterable.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);

// Python's `item in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

// markupsafe.escape.
std::string HtmlEscape(const std::string& s);

// range, namespace, dict.
std::vector<std::pair<std::string, Value>> DefaultGlobals();

absl::Status UndefinedError(const Value& v);

}  // namespace kvmesh::model::jinja
