#include "metrics/text_format.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvmesh::metrics {
namespace {

bool IsAsciiLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsAsciiDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

bool IsValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = IsAsciiLetter(c) || c == '_' || c == ':' || (i > 0 && IsAsciiDigit(c));
    if (!ok) return false;
  }
  return true;
}

bool IsValidLabelName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = IsAsciiLetter(c) || c == '_' || (i > 0 && IsAsciiDigit(c));
    if (!ok) return false;
  }
  return true;
}

bool IsValidUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int extra = 0;
    uint32_t code_point = 0;
    if ((c & 0xE0) == 0xC0) {
      extra = 1;
      code_point = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      code_point = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      code_point = c & 0x07;
    } else {
      return false;  // A continuation byte where a lead byte belongs, or 0xF8..0xFF.
    }
    if (end - p <= extra) return false;
    for (int i = 1; i <= extra; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      code_point = (code_point << 6) | (p[i] & 0x3F);
    }
    // 1. Overlong encodings, 2. UTF-16 surrogates, 3. beyond U+10FFFF.
    static constexpr uint32_t kMinForLength[4] = {0, 0x80, 0x800, 0x10000};
    if (code_point < kMinForLength[extra]) return false;
    if (code_point >= 0xD800 && code_point <= 0xDFFF) return false;
    if (code_point > 0x10FFFF) return false;
    p += extra + 1;
  }
  return true;
}

absl::Status ValidateMetricName(std::string_view name) {
  if (IsValidMetricName(name)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("invalid metric name \"", ToAbsl(name), "\": must match [a-zA-Z_:][a-zA-Z0-9_:]*"));
}

absl::Status ValidateLabelName(std::string_view name) {
  if (!IsValidLabelName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid label name \"", ToAbsl(name), "\": must match [a-zA-Z_][a-zA-Z0-9_]*"));
  }
  if (name.starts_with("__")) {
    return absl::InvalidArgumentError(
        absl::StrCat("label name \"", ToAbsl(name), "\" is reserved: names starting with \"__\" are internal"));
  }
  return absl::OkStatus();
}

void AppendEscapedHelp(std::string_view help, std::string* out) {
  for (char c : help) {
    switch (c) {
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      default:
        out->push_back(c);
    }
  }
}

void AppendEscapedLabelValue(std::string_view value, std::string* out) {
  for (char c : value) {
    switch (c) {
      case '\\':
        out->append("\\\\");
        break;
      case '"':
        out->append("\\\"");
        break;
      case '\n':
        out->append("\\n");
        break;
      default:
        out->push_back(c);
    }
  }
}

void AppendDouble(double value, std::string* out) {
  if (std::isnan(value)) {
    out->append("NaN");
    return;
  }
  if (std::isinf(value)) {
    out->append(value > 0 ? "+Inf" : "-Inf");
    return;
  }
  // 1. Integers print as integers ("3", "1000000", not "1e+06") while exact.
  if (std::trunc(value) == value && std::fabs(value) < 9007199254740992.0 /* 2^53 */) {
    char buffer[24];
    const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), static_cast<int64_t>(value));
    out->append(buffer, result.ptr);
    return;
  }
  // 2. Moderate magnitudes in fixed notation ("0.001", "2.5"), 3. the rest in
  // scientific ("1e-06"); both the shortest digits that round-trip.
  const double magnitude = std::fabs(value);
  const std::chars_format format =
      magnitude >= 1e-5 && magnitude < 1e15 ? std::chars_format::fixed : std::chars_format::scientific;
  char buffer[64];  // Fixed notation of 1e-5 <= |v| < 1e15 with 17 digits fits easily.
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), value, format);
  out->append(buffer, result.ptr);
}

}  // namespace kvmesh::metrics
