// jinja2's tests: `x is defined`, `x is divisibleby 3`, ...
#include "absl/strings/str_cat.h"
#include "model/jinja/builtins.h"
#include "model/jinja/python_format.h"

namespace kvmesh::model::jinja {
namespace {

const char* const kTests[] = {"defined", "undefined", "none", "string", "mapping", "iterable", "number",
                              "sequence", "boolean", "true", "false", "equalto", "eq", "==", "ne", "!=",
                              "sameas", "odd", "even", "divisibleby", "integer", "float", "lower", "upper",
                              "callable", "in", "gt", ">", "greaterthan", "ge", ">=", "lt", "<", "lessthan",
                              "le", "<="};

}  // namespace

bool IsKnownTest(const std::string& name) {
  for (const char* t : kTests) {
    if (name == t) return true;
  }
  return false;
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, CallArgs& call) {
  ArgReader args(call, name);
  bool result = false;
  const auto need_int = [&](const Value& x) -> absl::Status {
    if (x.is_undefined()) return UndefinedError(x);
    if (!x.is_int() && !x.is_bool()) {
      return absl::InvalidArgumentError(absl::StrCat("test '", name, "' needs an integer, got ", x.TypeName()));
    }
    return absl::OkStatus();
  };
  if (name == "defined") {
    result = !v.is_undefined();
  } else if (name == "undefined") {
    result = v.is_undefined();
  } else if (name == "none") {
    result = v.is_none();
  } else if (name == "string") {
    result = v.is_string();
  } else if (name == "mapping") {
    result = v.is_dict() && !v.dict().is_namespace;
  } else if (name == "iterable") {
    result = v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  } else if (name == "sequence") {
    result = v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.dict().is_namespace);
  } else if (name == "number") {
    result = v.is_number();
  } else if (name == "integer") {
    result = v.is_int();
  } else if (name == "float") {
    result = v.is_float();
  } else if (name == "boolean") {
    result = v.is_bool();
  } else if (name == "true") {
    result = v.is_bool() && v.as_bool();
  } else if (name == "false") {
    result = v.is_bool() && !v.as_bool();
  } else if (name == "callable") {
    result = v.is_function();
  } else if (name == "lower" || name == "upper") {
    if (!v.is_string()) {
      result = false;
    } else {
      bool cased = false, ok = true;
      for (char c : v.as_string()) {
        if (std::islower(static_cast<unsigned char>(c))) {
          cased = true;
          ok = ok && name == "lower";
        } else if (std::isupper(static_cast<unsigned char>(c))) {
          cased = true;
          ok = ok && name == "upper";
        }
      }
      result = ok && cased;
    }
  } else if (name == "odd" || name == "even") {
    if (absl::Status s = need_int(v); !s.ok()) return s;
    const int64_t r = ((v.as_int() % 2) + 2) % 2;
    result = name == "odd" ? r == 1 : r == 0;
  } else if (name == "divisibleby") {
    const Value n = args.Get(0, "num");
    if (absl::Status s = need_int(v); !s.ok()) return s;
    if (absl::Status s = need_int(n); !s.ok()) return s;
    if (n.as_int() == 0) return absl::InvalidArgumentError("integer modulo by zero in 'divisibleby'");
    result = v.as_int() % n.as_int() == 0;
  } else if (name == "in") {
    absl::StatusOr<bool> c = Contains(args.Get(0, "seq"), v);
    if (!c.ok()) return c.status();
    result = *c;
  } else if (name == "sameas") {
    const Value o = args.Get(0, "other");
    result = o.kind() == v.kind() && (v.is_none() || v.is_undefined() || (v.is_bool() && Equals(v, o)) ||
                                      ((v.is_list() || v.is_dict()) && Equals(v, o) &&
                                       (v.is_list() ? &v.list() == &o.list() : &v.dict() == &o.dict())));
  } else {
    const Value o = args.Get(0, "other");
    if (name == "equalto" || name == "eq" || name == "==") {
      result = Equals(v, o);
    } else if (name == "ne" || name == "!=") {
      result = !Equals(v, o);
    } else {
      absl::StatusOr<bool> r = Value::Kind::kUndefined == v.kind() ? absl::StatusOr<bool>(UndefinedError(v))
                                                                   : absl::StatusOr<bool>(false);
      if (name == "lt" || name == "<" || name == "lessthan") r = Less(v, o);
      if (name == "gt" || name == ">" || name == "greaterthan") r = Less(o, v);
      if (name == "le" || name == "<=") {
        r = Less(o, v);
        if (r.ok()) r = !*r;
      }
      if (name == "ge" || name == ">=") {
        r = Less(v, o);
        if (r.ok()) r = !*r;
      }
      if (!r.ok()) return r.status();
      result = *r;
    }
  }
  if (absl::Status s = args.Done(); !s.ok()) return s;
  return result;
}

}  // namespace kvmesh::model::jinja
