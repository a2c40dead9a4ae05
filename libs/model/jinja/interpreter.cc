// Template::Render: walks the tree with jinja2's scoping (a for loop and a
// macro call open a scope; if and set do not), its operators on Python values,
// and loop controls.
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "model/jinja/builtins.h"
#include "model/jinja/parser.h"
#include "model/jinja/python_format.h"
#include "model/jinja/template.h"

namespace kvmesh::model::jinja {
namespace {

// Eval frames one render may have on the stack, macro bodies included: the parser
// bounds nesting by recursion, but a left-associative chain (1-1-1-...) is built in a
// loop and is as deep as it is long, and a macro called from deep inside one stacks its
// body's expressions on top (`f(n - 1) - 1 - 1 ...` in f). Deeper fails instead of
// overflowing the stack.
constexpr int kMaxEvalDepth = 200;
// Macro calls nested: each costs far more stack than an Eval frame. Under ASan, on an
// 8 MiB stack, a one-line recursive macro overflowed between 220 and 240 calls deep
// (~35 KB a level) and a chain between 600 and 800 Eval frames (~11 KB each); 64 calls
// and 200 frames together stay under 4 MiB. Below kMaxEvalDepth, so that a runaway
// recursion is reported as one. Real templates recurse a few levels (tool schemas).
constexpr int kMaxCallDepth = 64;
// Loop iterations and macro calls one render may run: real chat templates run a few per
// message and tool; without a bound, nested loops or a macro calling itself twice per
// level (2^64 calls within the depth limit) would hold a request thread indefinitely.
constexpr int64_t kMaxRenderSteps = 1000000;
// A list repetition may make at most this many items (as range(), globals.cc: jinja2's
// sandbox MAX_RANGE); a string one at most kMaxGeneratedBytes.
constexpr int64_t kMaxRepeatedItems = 100000;

struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* Find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      for (const auto& [k, v] : s->vars) {
        if (k == name) return &v;
      }
    }
    return nullptr;
  }
  void Set(const std::string& name, Value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};

enum class Flow { kNormal, kBreak, kContinue };

absl::Status At(int line, const absl::Status& s) {
  if (s.ok() || absl::StartsWith(s.message(), "chat template line ")) return s;
  return absl::Status(s.code(), absl::StrCat("chat template line ", line, ": ", s.message()));
}

// Integers are 64-bit here (Python's are unbounded): a result that does not fit is an
// error, never undefined behaviour or a wrapped value.
absl::Status IntegerOverflow(const std::string& op) {
  return absl::InvalidArgumentError(absl::StrCat("integer overflow in '", op, "' (chat templates compute with 64-bit integers)"));
}

// x ** e for e >= 0, by squaring (a linear loop took as many steps as the exponent).
absl::StatusOr<int64_t> IntPower(int64_t x, int64_t e) {
  int64_t result = 1;
  while (e > 0) {
    if ((e & 1) != 0 && __builtin_mul_overflow(result, x, &result)) return IntegerOverflow("**");
    e >>= 1;
    // A square that overflows is used later, as the exponent has a higher bit left.
    if (e > 0 && __builtin_mul_overflow(x, x, &x)) return IntegerOverflow("**");
  }
  return result;
}

absl::StatusOr<Value> Arith(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  const auto type_error = [&]() {
    return absl::InvalidArgumentError(absl::StrCat("unsupported operand type(s) for ", op, ": '", a.TypeName(),
                                                   "' and '", b.TypeName(), "'"));
  };
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.is_safe_string() || b.is_safe_string()) {
        return Value::SafeString((a.is_safe_string() ? a.as_string() : HtmlEscape(a.as_string())) +
                                 (b.is_safe_string() ? b.as_string() : HtmlEscape(b.as_string())));
      }
      return Value::String(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list()) {
      if (a.list().is_tuple != b.list().is_tuple || a.is_generator() || b.is_generator()) return type_error();
      std::vector<Value> items = a.list().items;
      items.insert(items.end(), b.list().items.begin(), b.list().items.end());
      return Value::List(std::move(items), a.list().is_tuple);
    }
  }
  if (op == "*") {
    const Value* seq = a.is_string() || a.is_list() ? &a : (b.is_string() || b.is_list() ? &b : nullptr);
    const Value* n = seq == &a ? &b : &a;
    if (seq != nullptr && !seq->is_generator() && (n->is_int() || n->is_bool())) {
      int64_t times = std::max<int64_t>(0, n->as_int());
      const int64_t unit = seq->is_string() ? static_cast<int64_t>(seq->as_string().size())
                                            : static_cast<int64_t>(seq->list().items.size());
      const int64_t limit = seq->is_string() ? kMaxGeneratedBytes : kMaxRepeatedItems;
      if (unit > 0 && times > limit / unit) {
        return absl::InvalidArgumentError(absl::StrCat("repetition too big (", unit, " x ", times, "; at most ", limit,
                                                       seq->is_string() ? " bytes)" : " items)"));
      }
      if (unit == 0) times = 0;  // empty whatever the count
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < times; ++i) out += seq->as_string();
        return Value::String(std::move(out));
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < times; ++i) items.insert(items.end(), seq->list().items.begin(), seq->list().items.end());
      return Value::List(std::move(items), seq->list().is_tuple);
    }
  }
  if (!a.is_number() || !b.is_number()) return type_error();
  const bool ints = !a.is_float() && !b.is_float();
  if (ints && (op == "+" || op == "-" || op == "*")) {
    int64_t r = 0;
    const bool overflow = op == "+"   ? __builtin_add_overflow(a.as_int(), b.as_int(), &r)
                          : op == "-" ? __builtin_sub_overflow(a.as_int(), b.as_int(), &r)
                                      : __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
    if (overflow) return IntegerOverflow(op);
    return Value::Int(r);
  }
  if (op == "+") return Value::Float(a.as_float() + b.as_float());
  if (op == "-") return Value::Float(a.as_float() - b.as_float());
  if (op == "*") return Value::Float(a.as_float() * b.as_float());
  if (op == "/") {
    if (b.as_float() == 0) return absl::InvalidArgumentError("division by zero");
    return Value::Float(a.as_float() / b.as_float());
  }
  if (op == "//" || op == "%") {
    if (b.as_float() == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (x == std::numeric_limits<int64_t>::min() && y == -1) return IntegerOverflow(op);
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::Int(op == "//" ? q : r);
    }
    const double x = a.as_float(), y = b.as_float();
    const double q = std::floor(x / y);
    return op == "//" ? Value::Float(q) : Value::Float(x - q * y);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      KVMESH_ASSIGN_OR_RETURN(const int64_t r, IntPower(a.as_int(), b.as_int()));
      return Value::Int(r);
    }
    return Value::Float(std::pow(a.as_float(), b.as_float()));
  }
  return type_error();
}

class Interpreter {
 public:
  explicit Interpreter(Scope* root) : root_(root) {}

  absl::StatusOr<Flow> Exec(const Body& body, Scope& scope, std::string* out) {
    for (const StmtPtr& s : body) {
      absl::StatusOr<Flow> f = ExecOne(*s, scope, out);
      if (!f.ok()) return At(s->line, f.status());
      if (*f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Value> Eval(const Expr& e, Scope& scope) {
    if (eval_depth_ >= kMaxEvalDepth) {
      return At(e.line, absl::InvalidArgumentError(
                            absl::StrCat("expression nested more than ", kMaxEvalDepth, " levels deep")));
    }
    ++eval_depth_;
    absl::StatusOr<Value> v = EvalInner(e, scope);
    --eval_depth_;
    if (!v.ok()) return At(e.line, v.status());
    return v;
  }

 private:
  absl::StatusOr<Flow> ExecOne(const Stmt& s, Scope& scope, std::string* out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        *out += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        KVMESH_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
        *out += ToStr(v);
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          bool take = true;
          if (cond) {
            KVMESH_ASSIGN_OR_RETURN(Value c, Eval(*cond, scope));
            take = c.Truthy();
          }
          if (take) return Exec(body, scope, out);
        }
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        return ExecFor(s, scope, out);
      case Stmt::Kind::kSet: {
        KVMESH_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
        if (!s.attr.empty()) {
          const Value* target = scope.Find(s.targets[0]);
          if (target == nullptr || !target->is_dict() || !target->dict().is_namespace) {
            return absl::InvalidArgumentError(
                absl::StrCat("cannot assign attribute '", s.attr, "' on '", s.targets[0], "': not a namespace"));
          }
          target->dict().Set(s.attr, std::move(v));
          return Flow::kNormal;
        }
        KVMESH_RETURN_IF_ERROR(Assign(s.targets, v, scope));
        return Flow::kNormal;
      }
      case Stmt::Kind::kSetBlock: {
        std::string text;
        KVMESH_ASSIGN_OR_RETURN(Flow f, Exec(s.body, scope, &text));
        (void)f;
        Value v = Value::String(std::move(text));
        if (s.filter) {
          KVMESH_ASSIGN_OR_RETURN(Value filtered, ApplyChain(*s.filter, v, scope));
          v = filtered;
        }
        scope.Set(s.targets[0], std::move(v));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scope.Set(s.name, MakeMacro(s));
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        Scope* caller_scope = &scope;
        const Stmt* stmt = &s;
        Value caller = Value::Func("caller", [this, stmt, caller_scope](CallArgs& args) -> absl::StatusOr<Value> {
          Scope local{caller_scope, {}};
          KVMESH_RETURN_IF_ERROR(BindParams(*stmt, args, local, "caller"));
          std::string text;
          KVMESH_ASSIGN_OR_RETURN(Flow f, Exec(stmt->body, local, &text));
          (void)f;
          return Value::String(std::move(text));
        });
        KVMESH_ASSIGN_OR_RETURN(Value v, EvalCall(*s.expr, scope, &caller));
        *out += ToStr(v);
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        std::string text;
        KVMESH_ASSIGN_OR_RETURN(Flow f, Exec(s.body, scope, &text));
        (void)f;
        KVMESH_ASSIGN_OR_RETURN(Value v, ApplyChain(*s.filter, Value::String(std::move(text)), scope));
        *out += ToStr(v);
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        if (loop_depth_ == 0) return absl::InvalidArgumentError("'break' outside a loop");
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        if (loop_depth_ == 0) return absl::InvalidArgumentError("'continue' outside a loop");
        return Flow::kContinue;
      case Stmt::Kind::kGeneration:
        return Exec(s.body, scope, out);
    }
    return absl::InternalError("unknown statement");
  }

  absl::Status Assign(const std::vector<std::string>& targets, const Value& v, Scope& scope) {
    if (targets.size() == 1) {
      scope.Set(targets[0], v);
      return absl::OkStatus();
    }
    KVMESH_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    if (items.size() != targets.size()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot unpack ", items.size(), " values into ", targets.size(),
                                                     " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) scope.Set(targets[i], items[i]);
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> ExecFor(const Stmt& s, Scope& scope, std::string* out) {
    KVMESH_ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr, scope));
    KVMESH_ASSIGN_OR_RETURN(std::vector<Value> all, Iterate(iterable));
    std::vector<Value> items;
    if (s.cond) {
      for (const Value& item : all) {
        Scope probe{&scope, {}};
        KVMESH_RETURN_IF_ERROR(Assign(s.targets, item, probe));
        KVMESH_ASSIGN_OR_RETURN(Value c, Eval(*s.cond, probe));
        if (c.Truthy()) items.push_back(item);
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) {
      Scope local{&scope, {}};
      return Exec(s.else_body, local, out);
    }
    ++loop_depth_;
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Scope local{&scope, {}};
      absl::Status st = TakeStep();
      if (st.ok()) st = Assign(s.targets, items[static_cast<size_t>(i)], local);
      if (!st.ok()) {
        --loop_depth_;
        return st;
      }
      Value loop = Value::Namespace();
      DictData& d = loop.dict();
      d.Set("index", Value::Int(i + 1));
      d.Set("index0", Value::Int(i));
      d.Set("revindex", Value::Int(n - i));
      d.Set("revindex0", Value::Int(n - i - 1));
      d.Set("first", Value::Bool(i == 0));
      d.Set("last", Value::Bool(i == n - 1));
      d.Set("length", Value::Int(n));
      d.Set("depth", Value::Int(1));
      d.Set("depth0", Value::Int(0));
      d.Set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::Undefined("there is no previous item"));
      d.Set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::Undefined("there is no next item"));
      d.Set("cycle", Value::Func("loop.cycle", [i](CallArgs& args) -> absl::StatusOr<Value> {
        if (args.positional.empty()) return absl::InvalidArgumentError("no items for cycling given");
        return args.positional[static_cast<size_t>(i) % args.positional.size()];
      }));
      local.Set("loop", std::move(loop));
      absl::StatusOr<Flow> f = Exec(s.body, local, out);
      if (!f.ok()) {
        --loop_depth_;
        return f.status();
      }
      if (*f == Flow::kBreak) break;
    }
    --loop_depth_;
    return Flow::kNormal;
  }

  absl::Status BindParams(const Stmt& s, CallArgs& args, Scope& local, const std::string& what) {
    std::vector<bool> bound(s.params.size(), false);
    std::vector<Value> varargs;
    for (size_t i = 0; i < args.positional.size(); ++i) {
      if (i < s.params.size()) {
        local.Set(s.params[i], args.positional[i]);
        bound[i] = true;
      } else {
        varargs.push_back(args.positional[i]);
      }
    }
    Value kwargs = Value::Dict();
    Value caller;
    for (auto& [k, v] : args.keyword) {
      if (k == "caller") {
        caller = v;
        continue;
      }
      bool found = false;
      for (size_t i = 0; i < s.params.size(); ++i) {
        if (s.params[i] == k) {
          if (bound[i]) return absl::InvalidArgumentError(absl::StrCat(what, "() got multiple values for '", k, "'"));
          local.Set(k, v);
          bound[i] = true;
          found = true;
        }
      }
      if (!found) kwargs.dict().Set(k, v);
    }
    for (size_t i = 0; i < s.params.size(); ++i) {
      if (bound[i]) continue;
      if (i < s.defaults.size() && s.defaults[i]) {
        KVMESH_ASSIGN_OR_RETURN(Value d, Eval(*s.defaults[i], local));
        local.Set(s.params[i], d);
      } else {
        local.Set(s.params[i], Value::Undefined(absl::StrCat("'", s.params[i], "' is undefined")));
      }
    }
    local.Set("varargs", Value::List(std::move(varargs)));
    local.Set("kwargs", kwargs);
    if (!caller.is_undefined()) local.Set("caller", caller);
    return absl::OkStatus();
  }

  Value MakeMacro(const Stmt& s) {
    const Stmt* stmt = &s;
    return Value::Func(s.name, [this, stmt](CallArgs& args) -> absl::StatusOr<Value> {
      KVMESH_RETURN_IF_ERROR(TakeStep());
      if (++call_depth_ > kMaxCallDepth) {
        --call_depth_;
        return absl::InvalidArgumentError(absl::StrCat("macro '", stmt->name, "' recursed too deeply"));
      }
      Scope local{root_, {}};
      absl::Status st = BindParams(*stmt, args, local, stmt->name);
      std::string text;
      absl::StatusOr<Flow> f = st.ok() ? Exec(stmt->body, local, &text) : absl::StatusOr<Flow>(st);
      --call_depth_;
      if (!f.ok()) return f.status();
      return Value::String(std::move(text));
    });
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, Scope& scope, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i) {
      KVMESH_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i], scope));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      KVMESH_ASSIGN_OR_RETURN(Value v, Eval(*x, scope));
      args.keyword.emplace_back(k, std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> EvalCall(const Expr& e, Scope& scope, const Value* caller) {
    KVMESH_ASSIGN_OR_RETURN(Value callee, Eval(*e.args[0], scope));
    KVMESH_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, scope, 1));
    if (caller != nullptr) args.keyword.emplace_back("caller", *caller);
    if (callee.is_undefined()) return UndefinedError(callee);
    if (!callee.is_function()) return absl::InvalidArgumentError(absl::StrCat("'", callee.TypeName(), "' object is not callable"));
    return callee.function()(args);
  }

  // Applies a kFilter chain whose innermost input is null to `input`.
  absl::StatusOr<Value> ApplyChain(const Expr& f, const Value& input, Scope& scope) {
    Value in = input;
    if (f.args[0]) {
      KVMESH_ASSIGN_OR_RETURN(Value inner, ApplyChain(*f.args[0], input, scope));
      in = inner;
    }
    KVMESH_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(f, scope, 1));
    return ApplyFilter(f.name, in, args);
  }

  absl::StatusOr<Value> EvalInner(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        if (const Value* v = scope.Find(e.name)) return *v;
        return Value::Undefined(absl::StrCat("'", e.name, "' is undefined"));
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        std::vector<Value> items;
        for (const ExprPtr& x : e.args) {
          KVMESH_ASSIGN_OR_RETURN(Value v, Eval(*x, scope));
          items.push_back(std::move(v));
        }
        return Value::List(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        Value d = Value::Dict();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          KVMESH_ASSIGN_OR_RETURN(Value k, Eval(*e.args[i], scope));
          KVMESH_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1], scope));
          if (!k.is_string()) return absl::InvalidArgumentError("dict keys must be strings");
          d.dict().Set(k.as_string(), std::move(v));
        }
        return d;
      }
      case Expr::Kind::kGetAttr: {
        KVMESH_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], scope));
        return GetAttr(obj, e.name);
      }
      case Expr::Kind::kGetItem: {
        KVMESH_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], scope));
        KVMESH_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1], scope));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice:
        return EvalSlice(e, scope);
      case Expr::Kind::kCall:
        return EvalCall(e, scope, nullptr);
      case Expr::Kind::kFilter: {
        KVMESH_ASSIGN_OR_RETURN(Value in, Eval(*e.args[0], scope));
        KVMESH_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, scope, 1));
        return ApplyFilter(e.name, in, args);
      }
      case Expr::Kind::kTest: {
        KVMESH_ASSIGN_OR_RETURN(Value in, Eval(*e.args[0], scope));
        KVMESH_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, scope, 1));
        KVMESH_ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, in, args));
        return Value::Bool(r != e.negated);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        KVMESH_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], scope));
        if (v.is_undefined()) return UndefinedError(v);
        if (!v.is_number()) return absl::InvalidArgumentError(absl::StrCat("bad operand type for unary -: '", v.TypeName(), "'"));
        if (e.kind == Expr::Kind::kPos) return v.is_float() ? v : Value::Int(v.as_int());
        return v.is_float() ? Value::Float(-v.as_float()) : Value::Int(-v.as_int());
      }
      case Expr::Kind::kNot: {
        KVMESH_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], scope));
        return Value::Bool(!v.Truthy());
      }
      case Expr::Kind::kAnd:
      case Expr::Kind::kOr: {
        KVMESH_ASSIGN_OR_RETURN(Value l, Eval(*e.args[0], scope));
        if (l.Truthy() == (e.kind == Expr::Kind::kOr)) return l;
        return Eval(*e.args[1], scope);
      }
      case Expr::Kind::kBinary: {
        KVMESH_ASSIGN_OR_RETURN(Value l, Eval(*e.args[0], scope));
        KVMESH_ASSIGN_OR_RETURN(Value r, Eval(*e.args[1], scope));
        if (e.name == "~") return Value::String(ToStr(l) + ToStr(r));
        return Arith(e.name, l, r);
      }
      case Expr::Kind::kCompare: {
        KVMESH_ASSIGN_OR_RETURN(Value left, Eval(*e.args[0], scope));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          KVMESH_ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1], scope));
          const std::string& op = e.ops[i];
          bool r = false;
          if (op == "==") {
            r = Equals(left, right);
          } else if (op == "!=") {
            r = !Equals(left, right);
          } else if (op == "in" || op == "notin") {
            KVMESH_ASSIGN_OR_RETURN(bool c, Contains(right, left));
            r = (op == "in") == c;
          } else {
            if (op == "<" || op == ">=") {
              KVMESH_ASSIGN_OR_RETURN(bool lt, Less(left, right));
              r = op == "<" ? lt : !lt;
            } else {
              KVMESH_ASSIGN_OR_RETURN(bool gt, Less(right, left));
              r = op == ">" ? gt : !gt;
            }
          }
          if (!r) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kCondExpr: {
        KVMESH_ASSIGN_OR_RETURN(Value c, Eval(*e.args[0], scope));
        if (c.Truthy()) return Eval(*e.args[1], scope);
        if (e.args[2]) return Eval(*e.args[2], scope);
        return Value::Undefined("the inline if-expression on line evaluated to false and no else section was defined");
      }
    }
    return absl::InternalError("unknown expression");
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e, Scope& scope) {
    KVMESH_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], scope));
    if (obj.is_undefined()) return UndefinedError(obj);
    std::optional<int64_t> bounds[3];
    for (int i = 0; i < 3; ++i) {
      if (!e.args[static_cast<size_t>(i) + 1]) continue;
      KVMESH_ASSIGN_OR_RETURN(Value b, Eval(*e.args[static_cast<size_t>(i) + 1], scope));
      if (b.is_none()) continue;
      if (!b.is_int() && !b.is_bool()) return absl::InvalidArgumentError("slice indices must be integers or None");
      bounds[i] = b.as_int();
    }
    const int64_t step = bounds[2].value_or(1);
    if (step == 0) return absl::InvalidArgumentError("slice step cannot be zero");
    std::vector<Value> items;
    std::vector<char32_t> cps;
    int64_t n = 0;
    if (obj.is_generator()) {
      return absl::InvalidArgumentError("'generator' object is not subscriptable");
    } else if (obj.is_list()) {
      n = static_cast<int64_t>(obj.list().items.size());
    } else if (obj.is_string() && !obj.is_generator()) {
      cps = CodePoints(obj.as_string());
      n = static_cast<int64_t>(cps.size());
    } else {
      return absl::InvalidArgumentError(absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
    }
    // Python's slice.indices().
    const auto clamp = [&](std::optional<int64_t> v, int64_t dflt, int64_t lo, int64_t hi) {
      if (!v) return dflt;
      int64_t x = *v;
      if (x < 0) x += n;
      return std::min(std::max(x, lo), hi);
    };
    const int64_t start = step > 0 ? clamp(bounds[0], 0, 0, n) : clamp(bounds[0], n - 1, -1, n - 1);
    const int64_t stop = step > 0 ? clamp(bounds[1], n, 0, n) : clamp(bounds[1], -1, -1, n - 1);
    std::vector<int64_t> idx;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
    if (obj.is_list()) {
      for (int64_t i : idx) items.push_back(obj.list().items[static_cast<size_t>(i)]);
      return Value::List(std::move(items), obj.list().is_tuple);
    }
    std::vector<char32_t> out;
    for (int64_t i : idx) out.push_back(cps[static_cast<size_t>(i)]);
    return Value::String(FromCodePoints(out));
  }

  Scope* root_;
  // One loop iteration or macro call of the render's budget (kMaxRenderSteps).
  absl::Status TakeStep() {
    if (++steps_ <= kMaxRenderSteps) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("the template ran more than ", kMaxRenderSteps, " loop iterations and macro calls"));
  }

  int loop_depth_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;  // Eval frames on the stack
  int64_t steps_ = 0;
};

}  // namespace

absl::StatusOr<Template> Template::Parse(const std::string& source, const LexerOptions& options) {
  KVMESH_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source, options));
  KVMESH_ASSIGN_OR_RETURN(Body body, jinja::Parse(tokens));
  return Template(std::make_shared<const Body>(std::move(body)));
}

absl::StatusOr<std::string> Template::Render(const std::vector<std::pair<std::string, Value>>& globals) const {
  Scope builtins;
  builtins.vars = DefaultGlobals();
  Scope root{&builtins, {}};
  for (const auto& [k, v] : globals) root.Set(k, v);
  // NOTE: top-level `set` writes into a scope of its own, so that the caller's
  // variables are shadowed, never changed.
  Scope top{&root, {}};
  Interpreter interp(&top);
  std::string out;
  KVMESH_ASSIGN_OR_RETURN(Flow f, interp.Exec(*body_, top, &out));
  (void)f;
  return out;
}

}  // namespace kvmesh::model::jinja
