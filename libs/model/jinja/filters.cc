// jinja2's built-in filters (and transformers' tojson), as the chat templates
// use them: same argument names and defaults as jinja2 3.1.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status_macros.h"
#include "model/internal/utf8.h"
#include "model/jinja/builtins.h"
#include "model/jinja/python_format.h"

namespace kvmesh::model::jinja {
namespace {

const char* const kFilters[] = {
    "trim", "tojson", "length", "count", "items", "join", "default", "d", "replace", "upper", "lower",
    "capitalize", "title", "first", "last", "selectattr", "rejectattr", "select", "reject", "map", "list",
    "indent", "string", "int", "float", "abs", "round", "unique", "reverse", "sort", "dictsort", "batch",
    "safe", "escape", "e", "wordcount", "max", "min", "sum", "attr", "center"};

absl::Status Bad(const std::string& filter, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("filter '", filter, "': ", what));
}

std::string LowerAscii(std::string s) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(std::tolower(c));
  }
  return s;
}

// jinja2's make_attrgetter: "a.b.0" looks up each part with getitem.
absl::StatusOr<Value> LookupPath(const Value& v, const Value& attribute) {
  if (!attribute.is_string()) return GetItem(v, attribute);
  Value cur = v;
  for (absl::string_view part : absl::StrSplit(attribute.as_string(), '.')) {
    Value key = Value::String(std::string(part));
    int64_t idx = 0;
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit) && absl::SimpleAtoi(part, &idx)) {
      key = Value::Int(idx);
    }
    absl::StatusOr<Value> next = GetItem(cur, key);
    if (!next.ok()) return next.status();
    cur = *next;
  }
  return cur;
}

// Sort key for sort/unique/dictsort: case-folded strings unless case_sensitive.
Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(LowerAscii(v.as_string()));
  return v;
}

// A width argument that would make more than kMaxGeneratedBytes of padding.
absl::Status CheckWidth(const char* filter, int64_t width) {
  if (width <= kMaxGeneratedBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(filter, "(): width ", width, " is too big (at most ", kMaxGeneratedBytes, ")"));
}

std::string Indent(const std::string& s0, const Value& width, bool first, bool blank) {
  const std::string indention = width.is_string() ? width.as_string() : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' ');
  std::string s = s0 + "\n";
  // Python's str.splitlines() on \n, \r\n, \r and the other line boundaries.
  std::vector<std::string> lines;
  std::string cur;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    const char32_t cp = internal::DecodeUtf8(s, &pos);
    if (cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
        cp == 0x85 || cp == 0x2028 || cp == 0x2029) {
      if (cp == '\r' && pos < s.size() && s[pos] == '\n') ++pos;
      lines.push_back(cur);
      cur.clear();
    } else {
      cur.append(s, start, pos - start);
    }
  }
  if (!cur.empty()) lines.push_back(cur);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        rv += lines[i].empty() ? lines[i] : indention + lines[i];
      }
    }
  }
  if (first) rv = indention + rv;
  return rv;
}

absl::StatusOr<Value> ToJsonFilter(const Value& v, ArgReader& args) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
  const Value ensure_ascii = args.Get(0, "ensure_ascii", Value::Bool(false));
  const Value indent = args.Get(1, "indent", Value::None());
  const Value separators = args.Get(2, "separators", Value::None());
  const Value sort_keys = args.Get(3, "sort_keys", Value::Bool(false));
  JsonDumpOptions o;
  o.ensure_ascii = ensure_ascii.Truthy();
  o.sort_keys = sort_keys.Truthy();
  if (indent.is_string()) {
    o.indent = indent.as_string();
  } else if (indent.is_int()) {
    KVMESH_RETURN_IF_ERROR(CheckWidth("tojson", indent.as_int()));
    o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), ' ');
  }
  if (o.indent) o.item_separator = ",";
  if (separators.is_list() && separators.list().items.size() == 2 && separators.list().items[0].is_string() &&
      separators.list().items[1].is_string()) {
    o.item_separator = separators.list().items[0].as_string();
    o.key_separator = separators.list().items[1].as_string();
  }
  absl::StatusOr<std::string> s = ToJson(v, o);
  if (!s.ok()) return s.status();
  return Value::String(*s);
}

// Collects the args after the test name for select/reject.
CallArgs Rest(const CallArgs& call, size_t from) {
  CallArgs rest;
  for (size_t i = from; i < call.positional.size(); ++i) rest.positional.push_back(call.positional[i]);
  rest.keyword = call.keyword;
  return rest;
}

absl::StatusOr<Value> Select(const std::string& name, const Value& v, CallArgs& call) {
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool keep_if = name == "select" || name == "selectattr";
  // NOTE: jinja2 skips a falsy input (`if value:`), so `none | selectattr(...)` is empty.
  absl::StatusOr<std::vector<Value>> items = v.Truthy() ? Iterate(v) : std::vector<Value>{};
  if (!items.ok()) return items.status();
  size_t next = 0;
  Value attr;
  if (by_attr) {
    if (call.positional.empty()) return Bad(name, "missing attribute");
    attr = call.positional[next++];
  }
  std::string test;
  if (next < call.positional.size()) {
    if (!call.positional[next].is_string()) return Bad(name, "the test name must be a string");
    test = call.positional[next++].as_string();
    if (!IsKnownTest(test)) return Bad(name, absl::StrCat("no test named '", test, "'"));
  }
  std::vector<Value> out;
  for (const Value& item : *items) {
    Value x = item;
    if (by_attr) {
      absl::StatusOr<Value> got = LookupPath(item, attr);
      if (!got.ok()) return got.status();
      x = *got;
    }
    bool pass = false;
    if (test.empty()) {
      pass = x.Truthy();
    } else {
      CallArgs rest = Rest(call, next);
      rest.keyword.clear();
      absl::StatusOr<bool> r = ApplyTest(test, x, rest);
      if (!r.ok()) return r.status();
      pass = *r;
    }
    if (pass == keep_if) out.push_back(item);
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> Map(const Value& v, CallArgs& call) {
  absl::StatusOr<std::vector<Value>> items = v.Truthy() ? Iterate(v) : std::vector<Value>{};
  if (!items.ok()) return items.status();
  std::vector<Value> out;
  Value attribute, fallback;
  bool has_default = false;
  for (const auto& [k, val] : call.keyword) {
    if (k == "attribute") attribute = val;
    if (k == "default") {
      fallback = val;
      has_default = true;
    }
  }
  if (!attribute.is_undefined()) {
    for (const Value& item : *items) {
      absl::StatusOr<Value> got = LookupPath(item, attribute);
      if (!got.ok()) return got.status();
      out.push_back(got->is_undefined() && has_default ? fallback : *got);
    }
    return Value::Generator(std::move(out));
  }
  if (call.positional.empty() || !call.positional[0].is_string()) return Bad("map", "needs a filter name or attribute=");
  const std::string filter = call.positional[0].as_string();
  if (!IsKnownFilter(filter)) return Bad("map", absl::StrCat("no filter named '", filter, "'"));
  for (const Value& item : *items) {
    CallArgs rest = Rest(call, 1);
    absl::StatusOr<Value> r = ApplyFilter(filter, item, rest);
    if (!r.ok()) return r.status();
    out.push_back(*r);
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> SortFilter(const Value& v, ArgReader& args, bool dictsort) {
  if (dictsort) {
    const bool case_sensitive = args.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
    const Value by = args.Get(1, "by", Value::String("key"));
    const bool reverse = args.Get(2, "reverse", Value::Bool(false)).Truthy();
    if (!v.is_dict()) return Bad("dictsort", "needs a dict");
    std::vector<Value> pairs;
    for (const auto& [k, val] : v.dict().items) pairs.push_back(Value::List({Value::String(k), val}, true));
    const size_t pos = by.is_string() && by.as_string() == "value" ? 1 : 0;
    absl::Status err;
    std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& a, const Value& b) {
      absl::StatusOr<bool> l = Less(SortKey(a.list().items[pos], case_sensitive), SortKey(b.list().items[pos], case_sensitive));
      if (!l.ok()) err = l.status();
      return l.ok() && *l;
    });
    if (!err.ok()) return err;
    if (reverse) std::reverse(pairs.begin(), pairs.end());
    return Value::List(std::move(pairs));
  }
  const bool reverse = args.Get(0, "reverse", Value::Bool(false)).Truthy();
  const bool case_sensitive = args.Get(1, "case_sensitive", Value::Bool(false)).Truthy();
  const Value attribute = args.Get(2, "attribute", Value::None());
  absl::StatusOr<std::vector<Value>> items = Iterate(v);
  if (!items.ok()) return items.status();
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : *items) {
    Value key = item;
    if (!attribute.is_none()) {
      absl::StatusOr<Value> got = LookupPath(item, attribute);
      if (!got.ok()) return got.status();
      key = *got;
    }
    keyed.emplace_back(SortKey(key, case_sensitive), item);
  }
  absl::Status err;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    absl::StatusOr<bool> l = reverse ? Less(b.first, a.first) : Less(a.first, b.first);
    if (!l.ok()) err = l.status();
    return l.ok() && *l;
  });
  if (!err.ok()) return err;
  std::vector<Value> out;
  for (auto& [k, item] : keyed) out.push_back(item);
  return Value::List(std::move(out));
}

}  // namespace

bool IsKnownFilter(const std::string& name) {
  for (const char* f : kFilters) {
    if (name == f) return true;
  }
  return false;
}

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, CallArgs& call) {
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") return Select(name, v, call);
  if (name == "map") return Map(v, call);
  ArgReader args(call, name);
  Value result;
  if (name == "trim") {
    const Value chars = args.Get(0, "chars", Value::None());
    std::optional<std::string> set;
    if (chars.is_string()) set = chars.as_string();
    result = Value::String(PyStrip(ToStr(v), set, true, true));
  } else if (name == "tojson") {
    absl::StatusOr<Value> r = ToJsonFilter(v, args);
    if (!r.ok()) return r.status();
    result = *r;
  } else if (name == "length" || name == "count") {
    if (v.is_string()) {
      result = Value::Int(static_cast<int64_t>(CodePointLength(v.as_string())));
    } else if (v.is_list() && !v.is_generator()) {
      result = Value::Int(static_cast<int64_t>(v.list().items.size()));
    } else if (v.is_dict()) {
      result = Value::Int(static_cast<int64_t>(v.dict().items.size()));
    } else if (v.is_undefined()) {
      result = Value::Int(0);
    } else {
      return Bad(name, absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
    }
  } else if (name == "items") {
    if (v.is_undefined()) {
      result = Value::List();
    } else if (!v.is_dict()) {
      return Bad(name, absl::StrCat("can only get item pairs from a mapping, not ", v.TypeName()));
    } else {
      std::vector<Value> out;
      for (const auto& [k, val] : v.dict().items) out.push_back(Value::List({Value::String(k), val}, true));
      result = Value::Generator(std::move(out));
    }
  } else if (name == "join") {
    const Value sep = args.Get(0, "d", Value::String(""));
    const Value attribute = args.Get(1, "attribute", Value::None());
    absl::StatusOr<std::vector<Value>> items = Iterate(v);
    if (!items.ok()) return items.status();
    std::string out;
    bool any_safe = sep.is_safe_string();
    for (size_t i = 0; i < items->size(); ++i) {
      Value item = (*items)[i];
      if (!attribute.is_none()) {
        absl::StatusOr<Value> got = LookupPath(item, attribute);
        if (!got.ok()) return got.status();
        item = *got;
      }
      if (i > 0) out += ToStr(sep);
      out += ToStr(item);
      any_safe = any_safe && true;
    }
    result = Value::String(std::move(out));
  } else if (name == "default" || name == "d") {
    const Value fallback = args.Get(0, "default_value", Value::String(""));
    const bool boolean = args.Get(1, "boolean", Value::Bool(false)).Truthy();
    result = (v.is_undefined() || (boolean && !v.Truthy())) ? fallback : v;
  } else if (name == "replace") {
    const Value old = args.Get(0, "old");
    const Value repl = args.Get(1, "new");
    const Value count = args.Get(2, "count", Value::None());
    CallArgs m;
    m.positional = {Value::String(ToStr(old)), Value::String(ToStr(repl)),
                    count.is_none() ? Value::Int(-1) : count};
    absl::StatusOr<Value> method = GetAttr(Value::String(ToStr(v)), "replace");
    if (!method.ok()) return method.status();
    absl::StatusOr<Value> r = method->function()(m);
    if (!r.ok()) return r.status();
    result = *r;
  } else if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    CallArgs none;
    absl::StatusOr<Value> method = GetAttr(Value::String(ToStr(v)), name);
    if (!method.ok()) return method.status();
    absl::StatusOr<Value> r = method->function()(none);
    if (!r.ok()) return r.status();
    result = *r;
  } else if (name == "first" || name == "last") {
    if (name == "last" && v.is_generator()) return Bad(name, "'generator' object is not reversible");
    absl::StatusOr<std::vector<Value>> items = Iterate(v);
    if (!items.ok()) return items.status();
    if (items->empty()) {
      result = Value::Undefined(absl::StrCat("No ", name, " item, sequence was empty."));
    } else {
      result = name == "first" ? items->front() : items->back();
    }
  } else if (name == "list") {
    absl::StatusOr<std::vector<Value>> items = Iterate(v);
    if (!items.ok()) return items.status();
    result = Value::List(std::move(*items));
  } else if (name == "indent") {
    const Value width = args.Get(0, "width", Value::Int(4));
    const bool first = args.Get(1, "first", Value::Bool(false)).Truthy();
    const bool blank = args.Get(2, "blank", Value::Bool(false)).Truthy();
    if (!width.is_string()) {
      KVMESH_RETURN_IF_ERROR(CheckWidth("indent", width.as_int()));
    }
    result = Value::String(Indent(ToStr(v), width, first, blank));
  } else if (name == "string") {
    result = v.is_string() ? v : Value::String(ToStr(v));
  } else if (name == "safe") {
    result = Value::SafeString(ToStr(v));
  } else if (name == "escape" || name == "e") {
    result = v.is_safe_string() ? v : Value::SafeString(HtmlEscape(ToStr(v)));
  } else if (name == "int") {
    const Value fallback = args.Get(0, "default", Value::Int(0));
    if (v.is_int() || v.is_bool()) {
      result = Value::Int(v.as_int());
    } else if (v.is_float()) {
      result = Value::Int(static_cast<int64_t>(std::trunc(v.as_float())));
    } else if (v.is_string()) {
      const std::string s = PyStrip(v.as_string(), std::nullopt, true, true);
      int64_t i = 0;
      double f = 0;
      if (absl::SimpleAtoi(s, &i)) {
        result = Value::Int(i);
      } else if (absl::SimpleAtod(s, &f) && std::isfinite(f)) {
        result = Value::Int(static_cast<int64_t>(std::trunc(f)));
      } else {
        result = fallback;
      }
    } else {
      result = fallback;
    }
  } else if (name == "float") {
    const Value fallback = args.Get(0, "default", Value::Float(0.0));
    double f = 0;
    if (v.is_number()) {
      result = Value::Float(v.as_float());
    } else if (v.is_string() && absl::SimpleAtod(PyStrip(v.as_string(), std::nullopt, true, true), &f)) {
      result = Value::Float(f);
    } else {
      result = fallback;
    }
  } else if (name == "abs") {
    if (!v.is_number()) return Bad(name, absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
    result = v.is_float() ? Value::Float(std::fabs(v.as_float())) : Value::Int(std::llabs(v.as_int()));
  } else if (name == "round") {
    const int64_t precision = args.Get(0, "precision", Value::Int(0)).as_int();
    const Value method = args.Get(1, "method", Value::String("common"));
    if (!v.is_number()) return Bad(name, "needs a number");
    const double scale = std::pow(10.0, static_cast<double>(precision));
    double x = v.as_float() * scale;
    const std::string m = method.is_string() ? method.as_string() : "common";
    if (m == "common") {
      x = std::round(x);
    } else if (m == "ceil") {
      x = std::ceil(x);
    } else if (m == "floor") {
      x = std::floor(x);
    } else {
      return Bad(name, "method must be 'common', 'ceil' or 'floor'");
    }
    result = Value::Float(x / scale);
  } else if (name == "unique") {
    const bool case_sensitive = args.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
    const Value attribute = args.Get(1, "attribute", Value::None());
    absl::StatusOr<std::vector<Value>> items = Iterate(v);
    if (!items.ok()) return items.status();
    std::vector<Value> out, seen;
    for (const Value& item : *items) {
      Value key = item;
      if (!attribute.is_none()) {
        absl::StatusOr<Value> got = LookupPath(item, attribute);
        if (!got.ok()) return got.status();
        key = *got;
      }
      key = SortKey(key, case_sensitive);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    result = Value::Generator(std::move(out));
  } else if (name == "reverse") {
    if (v.is_string()) {
      std::vector<char32_t> cps = CodePoints(v.as_string());
      std::reverse(cps.begin(), cps.end());
      result = Value::String(FromCodePoints(cps));
    } else {
      absl::StatusOr<std::vector<Value>> items = Iterate(v);
      if (!items.ok()) return items.status();
      std::reverse(items->begin(), items->end());
      result = Value::Generator(std::move(*items));
    }
  } else if (name == "sort" || name == "dictsort") {
    absl::StatusOr<Value> r = SortFilter(v, args, name == "dictsort");
    if (!r.ok()) return r.status();
    result = *r;
  } else if (name == "batch") {
    const int64_t n = args.Get(0, "linecount").as_int();
    const Value fill = args.Get(1, "fill_with", Value::None());
    if (n <= 0) return Bad(name, "linecount must be positive");
    absl::StatusOr<std::vector<Value>> items = Iterate(v);
    if (!items.ok()) return items.status();
    std::vector<Value> out, cur;
    for (const Value& item : *items) {
      cur.push_back(item);
      if (static_cast<int64_t>(cur.size()) == n) {
        out.push_back(Value::List(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      if (!fill.is_none()) {
        while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
      }
      out.push_back(Value::List(std::move(cur)));
    }
    result = Value::Generator(std::move(out));
  } else if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (char32_t cp : CodePoints(ToStr(v))) {
      const bool word = cp >= 0x80 || std::isalnum(static_cast<int>(cp)) || cp == '_';
      if (word && !in_word) ++n;
      in_word = word;
    }
    result = Value::Int(n);
  } else if (name == "max" || name == "min" || name == "sum") {
    absl::StatusOr<std::vector<Value>> items = Iterate(v);
    if (!items.ok()) return items.status();
    if (name == "sum") {
      const Value attribute = args.Get(0, "attribute", Value::None());
      Value total = args.Get(1, "start", Value::Int(0));
      for (const Value& item : *items) {
        Value x = item;
        if (!attribute.is_none()) {
          absl::StatusOr<Value> got = LookupPath(item, attribute);
          if (!got.ok()) return got.status();
          x = *got;
        }
        if (!x.is_number() || !total.is_number()) return Bad(name, "can only sum numbers");
        total = (x.is_float() || total.is_float()) ? Value::Float(total.as_float() + x.as_float())
                                                   : Value::Int(total.as_int() + x.as_int());
      }
      result = total;
    } else {
      const bool case_sensitive = args.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
      if (items->empty()) {
        result = Value::Undefined(absl::StrCat("No aggregated item, sequence was empty."));
      } else {
        Value best = (*items)[0];
        for (const Value& item : *items) {
          absl::StatusOr<bool> l = name == "max" ? Less(SortKey(best, case_sensitive), SortKey(item, case_sensitive))
                                                 : Less(SortKey(item, case_sensitive), SortKey(best, case_sensitive));
          if (!l.ok()) return l.status();
          if (*l) best = item;
        }
        result = best;
      }
    }
  } else if (name == "attr") {
    const Value a = args.Get(0, "name");
    if (!a.is_string()) return Bad(name, "needs an attribute name");
    absl::StatusOr<Value> r = GetAttr(v, a.as_string());
    if (!r.ok()) return r.status();
    result = *r;
  } else if (name == "center") {
    const int64_t width = args.Get(0, "width", Value::Int(80)).as_int();
    KVMESH_RETURN_IF_ERROR(CheckWidth("center", width));
    const std::string s = ToStr(v);
    const int64_t len = static_cast<int64_t>(CodePointLength(s));
    if (len >= width) {
      result = Value::String(s);
    } else {
      // Python's str.center puts the extra space on the right when the total is odd... and on the left when the width is odd.
      const int64_t marg = width - len;
      const int64_t left = marg / 2 + (marg & width & 1);
      result = Value::String(std::string(static_cast<size_t>(left), ' ') + s +
                             std::string(static_cast<size_t>(marg - left), ' '));
    }
  } else {
    return absl::InternalError(absl::StrCat("filter '", name, "' is listed but has no implementation"));
  }
  if (absl::Status s = args.Done(); !s.ok()) return s;
  return result;
}

}  // namespace kvmesh::model::jinja
