#include "model/jinja/python_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "model/internal/utf8.h"

namespace kvmesh::model::jinja {
namespace {

void AppendReprString(const std::string& s, std::string* out) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  out->push_back(quote);
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    const char32_t cp = internal::DecodeUtf8(s, &pos);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      *out += "\\n";
    } else if (cp == '\r') {
      *out += "\\r";
    } else if (cp == '\t') {
      *out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      *out += buf;
    } else if (cp == 0x2028 || cp == 0x2029) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      *out += buf;
    } else {
      out->append(s, start, pos - start);
    }
  }
  out->push_back(quote);
}

void AppendJsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    const char32_t cp = internal::DecodeUtf8(s, &pos);
    char buf[16];
    switch (cp) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7f)) {
          if (cp >= 0x10000) {
            const char32_t v = cp - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                          static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
          }
          *out += buf;
        } else {
          out->append(s, start, pos - start);
        }
    }
  }
  out->push_back('"');
}

absl::Status AppendJson(const Value& v, const JsonDumpOptions& o, int depth, std::string* out) {
  const auto newline = [&](int d) {
    out->push_back('\n');
    for (int i = 0; i < d; ++i) *out += *o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.as_int());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double f = v.as_float();
      if (std::isnan(f)) {
        *out += "NaN";
      } else if (std::isinf(f)) {
        *out += f > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += FloatRepr(f);
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      AppendJsonString(v.as_string(), o.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      const auto& items = v.list().items;
      if (v.is_generator()) return absl::InvalidArgumentError("Object of type generator is not JSON serializable");
      if (items.empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += o.item_separator;
        if (o.indent) newline(depth + 1);
        if (auto s = AppendJson(items[i], o, depth + 1, out); !s.ok()) return s;
      }
      if (o.indent) newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict().items) items.push_back(&kv);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      if (items.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += o.item_separator;
        if (o.indent) newline(depth + 1);
        AppendJsonString(items[i]->first, o.ensure_ascii, out);
        *out += o.key_separator;
        if (auto s = AppendJson(items[i]->second, o, depth + 1, out); !s.ok()) return s;
      }
      if (o.indent) newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
    case Value::Kind::kUndefined:
      return absl::InvalidArgumentError("Object of type Undefined is not JSON serializable");
    case Value::Kind::kFunction:
      return absl::InvalidArgumentError("Object of type function is not JSON serializable");
  }
  return absl::InternalError("unknown value kind");
}

}  // namespace

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci: [-]d[.ddd]e[+-]XX
  bool neg = false;
  if (!sci.empty() && sci[0] == '-') {
    neg = true;
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exp = std::stoi(sci.substr(e + 1));
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out += digits;
      out.append(static_cast<size_t>(exp + 1 - static_cast<int>(digits.size())), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp + 1));
      out += ".";
      out += digits.substr(static_cast<size_t>(exp + 1));
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return out;
}

std::string ToStr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kString:
      return v.as_string();
    default:
      return ToRepr(v);
  }
}

std::string ToRepr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return absl::StrCat(v.as_int());
    case Value::Kind::kFloat:
      return FloatRepr(v.as_float());
    case Value::Kind::kString: {
      std::string out;
      AppendReprString(v.as_string(), &out);
      return out;
    }
    case Value::Kind::kList: {
      if (v.is_generator()) return "<generator object>";
      const bool tuple = v.list().is_tuple;
      std::string out = tuple ? "(" : "[";
      const auto& items = v.list().items;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        out += ToRepr(items[i]);
      }
      if (tuple && items.size() == 1) out += ",";
      out += tuple ? ")" : "]";
      return out;
    }
    case Value::Kind::kDict: {
      std::string out = v.dict().is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, val] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        AppendReprString(k, &out);
        out += ": ";
        out += ToRepr(val);
      }
      out += v.dict().is_namespace ? "}>" : "}";
      return out;
    }
    case Value::Kind::kFunction:
      return absl::StrCat("<function ", v.function_name(), ">");
  }
  return "";
}

absl::StatusOr<std::string> ToJson(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  if (auto s = AppendJson(v, options, 0, &out); !s.ok()) return s;
  return out;
}

std::vector<char32_t> CodePoints(std::string_view s) {
  std::vector<char32_t> out;
  const std::string valid = internal::ToValidUtf8(s);
  size_t pos = 0;
  while (pos < valid.size()) out.push_back(internal::DecodeUtf8(valid, &pos));
  return out;
}

std::string FromCodePoints(const std::vector<char32_t>& cps) {
  std::string out;
  for (char32_t c : cps) internal::AppendUtf8(c, &out);
  return out;
}

size_t CodePointLength(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::vector<char32_t> cps = CodePoints(s);
  std::vector<char32_t> strip_set;
  if (chars) strip_set = CodePoints(*chars);
  const auto strip = [&](char32_t c) {
    if (!chars) return internal::IsPythonSpace(c);
    return std::find(strip_set.begin(), strip_set.end(), c) != strip_set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return FromCodePoints(std::vector<char32_t>(cps.begin() + static_cast<std::ptrdiff_t>(b),
                                              cps.begin() + static_cast<std::ptrdiff_t>(e)));
}

}  // namespace kvmesh::model::jinja
