// Value: the dynamic type a Jinja template computes with, shaped after the
// Python objects jinja2 sees when transformers renders a chat template: None,
// bool, int, float, str, list/tuple, dict (insertion-ordered, string keys),
// callables (macros, bound methods, globals) and jinja2's default Undefined
// (renders empty, is falsy, iterates as empty; most operators on it fail).
//
// Lists and dicts are shared by reference, as in Python: a namespace() set in a
// loop is seen after it. Strings are UTF-8; lengths and indices count code points.
//
// Thread-safety: a Value is not thread-safe; values live inside one render.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvmesh::model::jinja {

class Value;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using Function = std::function<absl::StatusOr<Value>(CallArgs& args)>;

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
  // A Python generator (what select, map, unique, ... return in jinja2): true
  // even when empty, no len(), not JSON, not subscriptable.
  bool is_generator = false;
};

struct DictData {
  std::vector<std::pair<std::string, Value>> items;  // insertion order
  bool is_namespace = false;                         // allows `set ns.attr = ...`
  const Value* Find(const std::string& key) const;
  Value* Find(const std::string& key);
  void Set(const std::string& key, Value v);
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // Undefined
  static Value Undefined(std::string hint = "") {
    Value v;
    v.str_ = std::move(hint);
    return v;
  }
  static Value None() { return Value(Kind::kNone); }
  static Value Bool(bool b) {
    Value v(Kind::kBool);
    v.int_ = b ? 1 : 0;
    return v;
  }
  static Value Int(int64_t i) {
    Value v(Kind::kInt);
    v.int_ = i;
    return v;
  }
  static Value Float(double f) {
    Value v(Kind::kFloat);
    v.float_ = f;
    return v;
  }
  static Value String(std::string s) {
    Value v(Kind::kString);
    v.str_ = std::move(s);
    return v;
  }
  // markupsafe's Markup: a string marked safe. `Markup + str` escapes the str
  // (functionary's templates depend on it through the `safe` filter).
  static Value SafeString(std::string s) {
    Value v = String(std::move(s));
    v.int_ = 1;
    return v;
  }
  static Value List(std::vector<Value> items = {}, bool is_tuple = false);
  static Value Generator(std::vector<Value> items) {
    Value v = List(std::move(items));
    v.list_->is_generator = true;
    return v;
  }
  bool is_generator() const { return kind_ == Kind::kList && list_->is_generator; }
  static Value Dict();
  static Value Namespace();
  static Value Func(std::string name, Function f);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return kind_ == Kind::kFloat ? static_cast<int64_t>(float_) : int_; }
  double as_float() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return str_; }
  bool is_safe_string() const { return kind_ == Kind::kString && int_ != 0; }
  // For Undefined: the name it stands for (for error messages).
  const std::string& undefined_hint() const { return str_; }
  // For functions: the name it was made with.
  const std::string& function_name() const { return str_; }

  ListData& list() const { return *list_; }
  DictData& dict() const { return *dict_; }
  const Function& function() const { return *func_; }

  // Python's bool(x).
  bool Truthy() const;
  // Python's type name, for error messages ("str", "int", "list", ...).
  std::string TypeName() const;

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::kUndefined;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<ListData> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<Function> func_;
};

// Python's `a == b` (1 == 1.0 == True; lists and dicts element-wise).
bool Equals(const Value& a, const Value& b);

// Python's `a < b` for numbers, strings and lists; InvalidArgument otherwise.
absl::StatusOr<bool> Less(const Value& a, const Value& b);

}  // namespace kvmesh::model::jinja
