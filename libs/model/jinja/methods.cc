// Attribute and item lookup, iteration, membership, and the str and dict
// methods a template can call (`content.strip()`, `message.get('x')`).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/internal/utf8.h"
#include "model/jinja/builtins.h"
#include "model/jinja/python_format.h"

namespace kvmesh::model::jinja {
namespace {

absl::Status TypeError(const std::string& what) { return absl::InvalidArgumentError(what); }


// Python's str.split(sep=None, maxsplit=-1) and rsplit.
Value Split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<Value> parts;
  if (sep.is_none() || sep.is_undefined()) {
    const std::vector<char32_t> cps = CodePoints(s);
    std::vector<std::vector<char32_t>> words;
    size_t i = 0;
    if (!from_right) {
      while (i < cps.size()) {
        while (i < cps.size() && internal::IsPythonSpace(cps[i])) ++i;
        if (i >= cps.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t e = cps.size();
          while (e > i && internal::IsPythonSpace(cps[e - 1])) --e;
          words.emplace_back(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(e));
          break;
        }
        size_t j = i;
        while (j < cps.size() && !internal::IsPythonSpace(cps[j])) ++j;
        words.emplace_back(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j));
        i = j;
      }
    } else {
      std::vector<char32_t> r(cps.rbegin(), cps.rend());
      Value rev = Split(FromCodePoints(r), Value::None(), maxsplit, false);
      for (auto it = rev.list().items.rbegin(); it != rev.list().items.rend(); ++it) {
        std::vector<char32_t> w = CodePoints(it->as_string());
        std::reverse(w.begin(), w.end());
        parts.push_back(Value::String(FromCodePoints(w)));
      }
      return Value::List(std::move(parts));
    }
    for (const auto& w : words) parts.push_back(Value::String(FromCodePoints(w)));
    return Value::List(std::move(parts));
  }
  const std::string d = sep.as_string();
  std::vector<std::string> pieces;
  if (!from_right) {
    size_t start = 0;
    while (true) {
      if (maxsplit >= 0 && static_cast<int64_t>(pieces.size()) == maxsplit) break;
      const size_t f = s.find(d, start);
      if (f == std::string::npos) break;
      pieces.push_back(s.substr(start, f - start));
      start = f + d.size();
    }
    pieces.push_back(s.substr(start));
  } else {
    size_t end = s.size();
    std::vector<std::string> rev;
    while (true) {
      if (maxsplit >= 0 && static_cast<int64_t>(rev.size()) == maxsplit) break;
      if (end < d.size()) break;
      const size_t f = s.rfind(d, end - d.size());
      if (f == std::string::npos) break;
      rev.push_back(s.substr(f + d.size(), end - f - d.size()));
      end = f;
    }
    rev.push_back(s.substr(0, end));
    pieces.assign(rev.rbegin(), rev.rend());
  }
  for (auto& p : pieces) parts.push_back(Value::String(std::move(p)));
  return Value::List(std::move(parts));
}

std::string Replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  if (old.empty()) {
    // Python inserts `repl` between every character (and at both ends).
    std::string out;
    int64_t n = 0;
    size_t pos = 0;
    while (pos <= s.size()) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (pos == s.size()) break;
      const size_t len = internal::Utf8LeadLength(static_cast<unsigned char>(s[pos]));
      out.append(s, pos, len);
      pos += len;
    }
    return out;
  }
  std::string out;
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(old, start);
    if (f == std::string::npos) break;
    out.append(s, start, f - start);
    out += repl;
    start = f + old.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

bool MatchesAffix(const std::string& s, const Value& affix, bool prefix) {
  const auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_list()) {
    for (const Value& v : affix.list().items) {
      if (v.is_string() && one(v.as_string())) return true;
    }
    return false;
  }
  return one(affix.as_string());
}

// Python's str.title(), approximated for ASCII letters; other code points
// pass through and count as cased when they are letters outside ASCII.
std::string Title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    const char32_t cp = internal::DecodeUtf8(s, &pos);
    if (cp < 0x80) {
      const char c = static_cast<char>(cp);
      const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
      out.push_back(alpha ? static_cast<char>(prev_cased ? std::tolower(c) : std::toupper(c)) : c);
      prev_cased = alpha;
    } else {
      out.append(s, start, pos - start);
      prev_cased = false;
    }
  }
  return out;
}

absl::StatusOr<Value> StringMethod(const std::string& s, const std::string& name, CallArgs& call) {
  ArgReader args(call, "str." + name);
  Value result;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value chars = args.Get(0, "chars", Value::None());
    std::optional<std::string> set;
    if (chars.is_string()) set = chars.as_string();
    result = Value::String(PyStrip(s, set, name != "rstrip", name != "lstrip"));
  } else if (name == "split" || name == "rsplit") {
    const Value sep = args.Get(0, "sep", Value::None());
    const Value maxsplit = args.Get(1, "maxsplit", Value::Int(-1));
    if (sep.is_string() && sep.as_string().empty()) return TypeError("ValueError: empty separator");
    result = Split(s, sep, maxsplit.as_int(), name == "rsplit");
  } else if (name == "startswith" || name == "endswith") {
    const Value affix = args.Get(0, "prefix");
    if (!affix.is_string() && !affix.is_list()) {
      return TypeError(absl::StrCat(name, " first arg must be str or a tuple of str, not ", affix.TypeName()));
    }
    result = Value::Bool(MatchesAffix(s, affix, name == "startswith"));
  } else if (name == "upper" || name == "lower") {
    std::string out = s;
    for (char& c : out) {
      if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(name == "upper" ? std::toupper(c) : std::tolower(c));
    }
    result = Value::String(std::move(out));
  } else if (name == "title") {
    result = Value::String(Title(s));
  } else if (name == "capitalize") {
    std::string out = s;
    for (size_t i = 0; i < out.size(); ++i) {
      if (static_cast<unsigned char>(out[i]) < 0x80) out[i] = static_cast<char>(i == 0 ? std::toupper(out[i]) : std::tolower(out[i]));
    }
    result = Value::String(std::move(out));
  } else if (name == "replace") {
    const Value old = args.Get(0, "old");
    const Value repl = args.Get(1, "new");
    const Value count = args.Get(2, "count", Value::Int(-1));
    if (!old.is_string() || !repl.is_string()) return TypeError("str.replace() takes two strings");
    result = Value::String(Replace(s, old.as_string(), repl.as_string(), count.as_int()));
  } else if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    const Value sub = args.Get(0, "sub");
    if (!sub.is_string()) return TypeError(absl::StrCat("str.", name, "() takes a string"));
    const std::string& n = sub.as_string();
    if (name == "count") {
      int64_t c = 0;
      if (n.empty()) {
        c = static_cast<int64_t>(CodePointLength(s)) + 1;
      } else {
        for (size_t p = s.find(n); p != std::string::npos; p = s.find(n, p + n.size())) ++c;
      }
      result = Value::Int(c);
    } else {
      const size_t f = name == "rfind" ? s.rfind(n) : s.find(n);
      if (f == std::string::npos && name == "index") return TypeError("ValueError: substring not found");
      result = Value::Int(f == std::string::npos ? -1 : static_cast<int64_t>(CodePointLength(s.substr(0, f))));
    }
  } else if (name == "join") {
    const Value items = args.Get(0, "iterable");
    absl::StatusOr<std::vector<Value>> list = Iterate(items);
    if (!list.ok()) return list.status();
    std::vector<std::string> parts;
    for (const Value& v : *list) {
      if (!v.is_string()) return TypeError("str.join() expects strings");
      parts.push_back(v.as_string());
    }
    result = Value::String(absl::StrJoin(parts, s));
  } else if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum" || name == "islower" ||
             name == "isupper") {
    bool ok = !s.empty();
    bool any_cased = false;
    for (char32_t cp : CodePoints(s)) {
      const bool ascii = cp < 0x80;
      const int c = static_cast<int>(cp);
      if (name == "isdigit") ok = ok && ascii && std::isdigit(c);
      if (name == "isspace") ok = ok && internal::IsPythonSpace(cp);
      if (name == "isalpha") ok = ok && ascii && std::isalpha(c);
      if (name == "isalnum") ok = ok && ascii && std::isalnum(c);
      if (name == "islower") {
        ok = ok && !(ascii && std::isupper(c));
        any_cased = any_cased || (ascii && std::islower(c));
      }
      if (name == "isupper") {
        ok = ok && !(ascii && std::islower(c));
        any_cased = any_cased || (ascii && std::isupper(c));
      }
    }
    if (name == "islower" || name == "isupper") ok = ok && any_cased;
    result = Value::Bool(ok);
  } else {
    return absl::InternalError(absl::StrCat("no str method ", name));
  }
  if (absl::Status s2 = args.Done(); !s2.ok()) return s2;
  return result;
}

absl::StatusOr<Value> DictMethod(const Value& d, const std::string& name, CallArgs& call) {
  ArgReader args(call, "dict." + name);
  Value result;
  if (name == "items" || name == "keys" || name == "values") {
    std::vector<Value> out;
    for (const auto& [k, v] : d.dict().items) {
      if (name == "items") {
        out.push_back(Value::List({Value::String(k), v}, /*is_tuple=*/true));
      } else {
        out.push_back(name == "keys" ? Value::String(k) : v);
      }
    }
    result = Value::List(std::move(out));
  } else if (name == "get") {
    const Value key = args.Get(0, "key");
    const Value fallback = args.Get(1, "default", Value::None());
    const Value* found = key.is_string() ? d.dict().Find(key.as_string()) : nullptr;
    result = found != nullptr ? *found : fallback;
  } else {
    return absl::InternalError(absl::StrCat("no dict method ", name));
  }
  if (absl::Status s = args.Done(); !s.ok()) return s;
  return result;
}

bool IsStringMethod(const std::string& n) {
  static const char* kNames[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith",
                                 "upper", "lower", "title", "capitalize", "replace", "find", "rfind",
                                 "index", "count", "join", "isdigit", "isspace", "isalpha", "isalnum",
                                 "islower", "isupper"};
  for (const char* k : kNames) {
    if (n == k) return true;
  }
  return false;
}

bool IsDictMethod(const std::string& n) { return n == "items" || n == "keys" || n == "values" || n == "get"; }

}  // namespace

Value ArgReader::Get(size_t index, const char* name, Value fallback) {
  max_positional_ = std::max(max_positional_, index + 1);
  known_.emplace_back(name);
  if (index < args_.positional.size()) return args_.positional[index];
  for (const auto& [k, v] : args_.keyword) {
    if (k == name) return v;
  }
  return fallback;
}

absl::Status ArgReader::Done() const {
  if (args_.positional.size() > max_positional_) {
    return absl::InvalidArgumentError(absl::StrCat(function_, "() takes at most ", max_positional_,
                                                   " positional argument(s), got ", args_.positional.size()));
  }
  for (const auto& [k, v] : args_.keyword) {
    if (std::find(known_.begin(), known_.end(), k) == known_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(function_, "() got an unexpected keyword argument '", k, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status UndefinedError(const Value& v) {
  if (v.undefined_hint().empty()) return absl::InvalidArgumentError("undefined value used");
  return absl::InvalidArgumentError(v.undefined_hint());
}

absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_dict()) {
    if (!obj.dict().is_namespace && IsDictMethod(name)) {
      Value self = obj;
      return Value::Func("dict." + name, [self, name](CallArgs& args) { return DictMethod(self, name, args); });
    }
    if (const Value* v = obj.dict().Find(name)) return *v;
    return Value::Undefined(absl::StrCat("'", obj.TypeName(), " object' has no attribute '", name, "'"));
  }
  if (obj.is_string() && IsStringMethod(name)) {
    const std::string s = obj.as_string();
    return Value::Func("str." + name, [s, name](CallArgs& args) { return StringMethod(s, name, args); });
  }
  return Value::Undefined(absl::StrCat("'", obj.TypeName(), " object' has no attribute '", name, "'"));
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.dict().Find(key.as_string())) return *v;
    return GetAttr(obj, key.as_string());
  }
  if (obj.is_generator()) return Value::Undefined("'generator' object is not subscriptable");
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const auto n = static_cast<int64_t>(obj.list().items.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::Undefined(absl::StrCat("'", obj.TypeName(), " object' has no element ", key.as_int()));
      return obj.list().items[static_cast<size_t>(i)];
    }
    const std::vector<char32_t> cps = CodePoints(obj.as_string());
    const auto n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::Undefined(absl::StrCat("'str object' has no element ", key.as_int()));
    std::string out;
    internal::AppendUtf8(cps[static_cast<size_t>(i)], &out);
    return Value::String(out);
  }
  if (key.is_string()) return GetAttr(obj, key.as_string());
  return Value::Undefined(absl::StrCat("'", obj.TypeName(), " object' has no element ", ToRepr(key)));
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>{};
    case Value::Kind::kList:
      return v.list().items;
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, val] : v.dict().items) keys.push_back(Value::String(k));
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (char32_t cp : CodePoints(v.as_string())) {
        std::string s;
        internal::AppendUtf8(cp, &s);
        chars.push_back(Value::String(std::move(s)));
      }
      return chars;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'in <string>' requires string as left operand, not ", item.TypeName()));
    }
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_dict()) return item.is_string() && container.dict().Find(item.as_string()) != nullptr;
  if (container.is_list()) {
    for (const Value& v : container.list().items) {
      if (Equals(v, item)) return true;
    }
    return false;
  }
  if (container.is_undefined()) return false;
  return absl::InvalidArgumentError(absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace kvmesh::model::jinja
