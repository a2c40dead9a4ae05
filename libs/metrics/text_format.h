// Prometheus text exposition format 0.0.4: the rules of the data model (which
// metric and label names are valid) and the escaping and number formatting that
// the Registry uses to write a scrape.
//
// Reference: https://prometheus.io/docs/instrumenting/exposition_formats/
//   - metric names match [a-zA-Z_:][a-zA-Z0-9_:]*
//   - label names match [a-zA-Z_][a-zA-Z0-9_]*; names starting with "__" are reserved
//   - label values are UTF-8; `\`, `"` and newline are escaped as \\, \" and \n
//   - HELP text is UTF-8; only `\` and newline are escaped. NOTE: a `\"` in a HELP
//     line is an "invalid escape sequence" to Prometheus' parser (promtool 2.42
//     rejects it), so double quotes in help text are written as they are.
//
// Thread-safety: stateless free functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvmesh::metrics {

// The HTTP Content-Type of Registry::Exposition()'s text.
inline constexpr std::string_view kExpositionContentType = "text/plain; version=0.0.4; charset=utf-8";

bool IsValidMetricName(std::string_view name);
// Syntax only; does not reject the reserved "__" prefix (ValidateLabelName does).
bool IsValidLabelName(std::string_view name);
bool IsValidUtf8(std::string_view text);

// InvalidArgument naming the offending name when it is not a valid metric name.
absl::Status ValidateMetricName(std::string_view name);
// InvalidArgument for a syntactically invalid label name or one starting with "__".
absl::Status ValidateLabelName(std::string_view name);

// Appends `help` with `\` -> `\\` and newline -> `\n`.
void AppendEscapedHelp(std::string_view help, std::string* out);
// Appends `value` with `\` -> `\\`, `"` -> `\"` and newline -> `\n`.
void AppendEscapedLabelValue(std::string_view value, std::string* out);
// Appends text that parses back to exactly `value`, in the forms Prometheus' Go
// parser reads: integers below 2^53 as integers ("3", "1000000"); other values with
// 1e-5 <= |v| < 1e15 in fixed notation ("0.25", "0.001"); the rest in scientific
// ("1e-06", "1.5e+20"); always the fewest digits that round-trip; "+Inf", "-Inf", "NaN".
void AppendDouble(double value, std::string* out);

}  // namespace kvmesh::metrics
