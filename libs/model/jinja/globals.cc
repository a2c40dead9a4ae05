// The global functions every template sees: range, namespace, dict.
#include "absl/strings/str_cat.h"
#include "model/jinja/builtins.h"

namespace kvmesh::model::jinja {

std::vector<std::pair<std::string, Value>> DefaultGlobals() {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::Func("range", [](CallArgs& args) -> absl::StatusOr<Value> {
    if (!args.keyword.empty() || args.positional.empty() || args.positional.size() > 3) {
      return absl::InvalidArgumentError("range() takes 1 to 3 positional arguments");
    }
    for (const Value& v : args.positional) {
      if (!v.is_int() && !v.is_bool()) {
        return absl::InvalidArgumentError(absl::StrCat("'", v.TypeName(), "' object cannot be interpreted as an integer"));
      }
    }
    int64_t start = 0, stop = 0, step = 1;
    if (args.positional.size() == 1) {
      stop = args.positional[0].as_int();
    } else {
      start = args.positional[0].as_int();
      stop = args.positional[1].as_int();
      if (args.positional.size() == 3) step = args.positional[2].as_int();
    }
    if (step == 0) return absl::InvalidArgumentError("range() arg 3 must not be zero");
    std::vector<Value> out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= 100000) return absl::InvalidArgumentError("range() too big (at most 100000 items)");
      out.push_back(Value::Int(i));
    }
    return Value::List(std::move(out));
  }));
  const auto make_dict = [](bool ns) {
    return [ns](CallArgs& args) -> absl::StatusOr<Value> {
      Value d = ns ? Value::Namespace() : Value::Dict();
      if (args.positional.size() > 1) return absl::InvalidArgumentError("expected at most 1 positional argument");
      if (args.positional.size() == 1) {
        if (!args.positional[0].is_dict()) return absl::InvalidArgumentError("expected a dict");
        for (const auto& [k, v] : args.positional[0].dict().items) d.dict().Set(k, v);
      }
      for (const auto& [k, v] : args.keyword) d.dict().Set(k, v);
      return d;
    };
  };
  g.emplace_back("namespace", Value::Func("namespace", make_dict(true)));
  g.emplace_back("dict", Value::Func("dict", make_dict(false)));
  return g;
}

}  // namespace kvmesh::model::jinja
