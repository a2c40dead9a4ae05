#include "model/jinja/value.h"

#include "absl/strings/str_cat.h"

namespace kvmesh::model::jinja {

const Value* DictData::Find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value* DictData::Find(const std::string& key) {
  for (auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void DictData::Set(const std::string& key, Value v) {
  if (Value* old = Find(key)) {
    *old = std::move(v);
  } else {
    items.emplace_back(key, std::move(v));
  }
}

Value Value::List(std::vector<Value> items, bool is_tuple) {
  Value v(Kind::kList);
  v.list_ = std::make_shared<ListData>();
  v.list_->items = std::move(items);
  v.list_->is_tuple = is_tuple;
  return v;
}

Value Value::Dict() {
  Value v(Kind::kDict);
  v.dict_ = std::make_shared<DictData>();
  return v;
}

Value Value::Namespace() {
  Value v = Dict();
  v.dict_->is_namespace = true;
  return v;
}

Value Value::Func(std::string name, Function f) {
  Value v(Kind::kFunction);
  v.str_ = std::move(name);
  v.func_ = std::make_shared<Function>(std::move(f));
  return v;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0;
    case Kind::kString:
      return !str_.empty();
    case Kind::kList:
      return list_->is_generator || !list_->items.empty();
    case Kind::kDict:
      return dict_->is_namespace || !dict_->items.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return list_->is_generator ? "generator" : (list_->is_tuple ? "tuple" : "list");
    case Kind::kDict:
      return dict_->is_namespace ? "Namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "object";
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const auto& x = a.list().items;
      const auto& y = b.list().items;
      if (a.is_generator() || b.is_generator()) return &a.list() == &b.list();
      if (x.size() != y.size() || a.list().is_tuple != b.list().is_tuple) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (&a.dict() == &b.dict()) return true;
      if (a.dict().is_namespace || b.dict().is_namespace) return false;
      const auto& x = a.dict().items;
      if (x.size() != b.dict().items.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* o = b.dict().Find(k);
        if (o == nullptr || !Equals(v, *o)) return false;
      }
      return true;
    }
    case Value::Kind::kFunction:
      return &a.function() == &b.function();
    default:
      return false;
  }
}

absl::StatusOr<bool> Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order is code point order
  if (a.is_list() && b.is_list()) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined() || b.is_undefined()) {
    return absl::InvalidArgumentError(a.is_undefined() ? a.undefined_hint() : b.undefined_hint());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'<' not supported between instances of '", a.TypeName(), "' and '", b.TypeName(), "'"));
}

}  // namespace kvmesh::model::jinja
