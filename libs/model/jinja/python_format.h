// How Python prints the values a template computes: str() for output, repr()
// inside containers, json.dumps() for the `tojson` filter (transformers' own
// version of it: ensure_ascii=False, optional indent / separators / sort_keys),
// and the code-point helpers Python's str methods need on UTF-8.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/jinja/value.h"

namespace kvmesh::model::jinja {

// Python's repr(float): the shortest round-trip digits, fixed notation for
// exponents in [-4, 16), scientific otherwise ("1e+16", "1.5e-05").
std::string FloatRepr(double f);

// str(v) as jinja2 writes it to the output (Undefined renders empty).
std::string ToStr(const Value& v);
// repr(v) ('quoted' strings, [lists], {'dicts': 1}, (tuples,)).
std::string ToRepr(const Value& v);

struct JsonDumpOptions {
  std::optional<std::string> indent;  // None: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps(v, ...). InvalidArgument for values JSON cannot hold (Undefined, functions).
absl::StatusOr<std::string> ToJson(const Value& v, const JsonDumpOptions& options);

// The code points of UTF-8 `s` (invalid bytes become U+FFFD).
std::vector<char32_t> CodePoints(std::string_view s);
std::string FromCodePoints(const std::vector<char32_t>& cps);
size_t CodePointLength(std::string_view s);

// Python's str.strip/lstrip/rstrip: whitespace when `chars` is empty-optional.
std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);

}  // namespace kvmesh::model::jinja
