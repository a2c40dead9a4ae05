#include "model/jinja/parser.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "model/jinja/builtins.h"

namespace kvmesh::model::jinja {
namespace {

using T = Token::Type;

absl::Status Error(int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

ExprPtr MakeExpr(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}


class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  absl::StatusOr<Body> ParseTemplate() {
    Body body;
    std::string stop;
    absl::Status s = ParseBody({}, &body, &stop);
    if (!s.ok()) return s;
    return body;
  }

 private:
  // Bounds the parser's recursion through nested expressions (unary operators, `not`,
  // parentheses, lists, conditionals): deeper fails instead of overflowing the stack.
  static constexpr int kMaxNesting = 200;
  class NestingGuard {
   public:
    explicit NestingGuard(Parser* p) : p_(p) { ++p_->nesting_; }
    ~NestingGuard() { --p_->nesting_; }
    absl::Status status() const {
      if (p_->nesting_ <= kMaxNesting) return absl::OkStatus();
      return Error(p_->Cur().line, absl::StrCat("expression nested more than ", kMaxNesting, " levels deep"));
    }

   private:
    Parser* p_;
  };

  const Token& Cur() const { return t_[pos_]; }
  const Token& Peek(size_t n = 1) const { return t_[std::min(pos_ + n, t_.size() - 1)]; }
  bool IsOp(const char* op) const { return Cur().type == T::kOperator && Cur().text == op; }
  bool IsName(const char* name) const { return Cur().type == T::kName && Cur().text == name; }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    ++pos_;
    return true;
  }
  bool SkipName(const char* name) {
    if (!IsName(name)) return false;
    ++pos_;
    return true;
  }
  std::string Describe(const Token& t) const {
    switch (t.type) {
      case T::kEnd: return "end of template";
      case T::kBlockEnd: return "'%}'";
      case T::kVariableEnd: return "'}}'";
      case T::kText: return "text";
      default: return absl::StrCat("'", t.text, "'");
    }
  }
  absl::Status ExpectOp(const char* op) {
    if (SkipOp(op)) return absl::OkStatus();
    return Error(Cur().line, absl::StrCat("expected '", op, "', got ", Describe(Cur())));
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type == T::kBlockEnd) {
      ++pos_;
      return absl::OkStatus();
    }
    return Error(Cur().line, absl::StrCat("expected '%}', got ", Describe(Cur())));
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != T::kName) return Error(Cur().line, absl::StrCat("expected a name, got ", Describe(Cur())));
    return t_[pos_++].text;
  }

  // Parses statements until `{% <one of stop>`, leaving `*stop_found` set to
  // the keyword and the position after it. Empty `stop`: until the end.
  absl::Status ParseBody(const std::vector<std::string>& stop, Body* body, std::string* stop_found) {
    while (true) {
      const Token& tok = Cur();
      if (tok.type == T::kEnd) {
        if (stop.empty()) return absl::OkStatus();
        return Error(tok.line, absl::StrCat("unexpected end of template, expected '{% ", stop.back(), " %}'"));
      }
      if (tok.type == T::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = tok.line;
        s->text = tok.text;
        body->push_back(std::move(s));
        ++pos_;
        continue;
      }
      if (tok.type == T::kVariableBegin) {
        ++pos_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = tok.line;
        KVMESH_ASSIGN_OR_RETURN(auto e, ParseTuple());
        s->expr = std::move(e);
        if (Cur().type != T::kVariableEnd) {
          return Error(Cur().line, absl::StrCat("expected '}}', got ", Describe(Cur())));
        }
        ++pos_;
        body->push_back(std::move(s));
        continue;
      }
      if (tok.type != T::kBlockBegin) return Error(tok.line, absl::StrCat("unexpected ", Describe(tok)));
      const Token& kw = Peek();
      if (kw.type != T::kName) return Error(kw.line, absl::StrCat("expected a statement name, got ", Describe(kw)));
      for (const std::string& s : stop) {
        if (kw.text == s) {
          pos_ += 2;
          *stop_found = s;
          return absl::OkStatus();
        }
      }
      pos_ += 2;
      KVMESH_ASSIGN_OR_RETURN(auto stmt, ParseStatement(kw));
      body->push_back(std::move(stmt));
    }
  }

  absl::StatusOr<StmtPtr> ParseStatement(const Token& kw) {
    auto s = std::make_unique<Stmt>();
    s->line = kw.line;
    const std::string& k = kw.text;
    std::string stop;
    if (k == "if") {
      s->kind = Stmt::Kind::kIf;
      KVMESH_ASSIGN_OR_RETURN(auto cond, ParseTuple());
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      while (true) {
        Body body;
        auto st = ParseBody({"elif", "else", "endif"}, &body, &stop);
        if (!st.ok()) return st;
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (stop == "elif") {
          KVMESH_ASSIGN_OR_RETURN(auto c2, ParseTuple());
          cond = std::move(c2);
          KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
        } else if (stop == "else") {
          KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
          Body else_body;
          st = ParseBody({"endif"}, &else_body, &stop);
          if (!st.ok()) return st;
          s->branches.emplace_back(nullptr, std::move(else_body));
          KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
          break;
        } else {
          KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
          break;
        }
      }
      return s;
    }
    if (k == "for") {
      s->kind = Stmt::Kind::kFor;
      do {
        KVMESH_ASSIGN_OR_RETURN(auto name, ExpectName());
        s->targets.push_back(name);
      } while (SkipOp(","));
      if (!SkipName("in")) return Error(Cur().line, absl::StrCat("expected 'in' in for loop, got ", Describe(Cur())));
      KVMESH_ASSIGN_OR_RETURN(auto iter, ParseTuple(/*with_condexpr=*/false));
      s->expr = std::move(iter);
      if (SkipName("if")) {
        KVMESH_ASSIGN_OR_RETURN(auto cond, ParseExpression());
        s->cond = std::move(cond);
      }
      if (IsName("recursive")) return Error(Cur().line, "recursive for loops are not supported");
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      auto st = ParseBody({"else", "endfor"}, &s->body, &stop);
      if (!st.ok()) return st;
      if (stop == "else") {
        KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
        st = ParseBody({"endfor"}, &s->else_body, &stop);
        if (!st.ok()) return st;
      }
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (k == "set") {
      KVMESH_ASSIGN_OR_RETURN(auto name, ExpectName());
      s->targets.push_back(name);
      if (SkipOp(".")) {
        KVMESH_ASSIGN_OR_RETURN(auto attr, ExpectName());
        s->attr = attr;
      }
      while (s->attr.empty() && SkipOp(",")) {
        KVMESH_ASSIGN_OR_RETURN(auto n2, ExpectName());
        s->targets.push_back(n2);
      }
      if (SkipOp("=")) {
        s->kind = Stmt::Kind::kSet;
        KVMESH_ASSIGN_OR_RETURN(auto value, ParseTuple());
        s->expr = std::move(value);
        KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
        return s;
      }
      if (s->targets.size() != 1 || !s->attr.empty()) return Error(s->line, "a block set takes one plain name");
      s->kind = Stmt::Kind::kSetBlock;
      if (IsOp("|")) {
        KVMESH_ASSIGN_OR_RETURN(auto f, ParseFilterChain(nullptr));
        s->filter = std::move(f);
      }
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      auto st = ParseBody({"endset"}, &s->body, &stop);
      if (!st.ok()) return st;
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (k == "macro") {
      s->kind = Stmt::Kind::kMacro;
      KVMESH_ASSIGN_OR_RETURN(auto name, ExpectName());
      s->name = name;
      KVMESH_RETURN_IF_ERROR(ParseParams(s.get()));
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      auto st = ParseBody({"endmacro"}, &s->body, &stop);
      if (!st.ok()) return st;
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (k == "call") {
      s->kind = Stmt::Kind::kCallBlock;
      if (IsOp("(")) KVMESH_RETURN_IF_ERROR(ParseParams(s.get()));
      KVMESH_ASSIGN_OR_RETURN(auto call, ParseExpression());
      if (call->kind != Expr::Kind::kCall) return Error(s->line, "{% call %} expects a macro call");
      s->expr = std::move(call);
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      auto st = ParseBody({"endcall"}, &s->body, &stop);
      if (!st.ok()) return st;
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (k == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      KVMESH_ASSIGN_OR_RETURN(auto f, ParseFilterChain(nullptr, /*leading_pipe=*/false));
      s->filter = std::move(f);
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      auto st = ParseBody({"endfilter"}, &s->body, &stop);
      if (!st.ok()) return st;
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (k == "break" || k == "continue") {
      s->kind = k == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (k == "generation") {
      s->kind = Stmt::Kind::kGeneration;
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      auto st = ParseBody({"endgeneration"}, &s->body, &stop);
      if (!st.ok()) return st;
      KVMESH_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    static const char* kEnds[] = {"endif", "endfor", "endset", "endmacro", "endcall", "endfilter", "elif", "else",
                                  "endgeneration"};
    for (const char* e : kEnds) {
      if (k == e) return Error(kw.line, absl::StrCat("unexpected '{% ", k, " %}' with no open block it closes"));
    }
    return Error(kw.line, absl::StrCat("the '", k,
                                       "' statement is not supported (chat templates use for, if, set, macro, "
                                       "call, filter, break, continue)"));
  }

  // `(a, b=default, ...)` of a macro or call block.
  absl::Status ParseParams(Stmt* s) {
    KVMESH_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!s->params.empty()) KVMESH_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      KVMESH_ASSIGN_OR_RETURN(auto name, ExpectName());
      s->params.push_back(name);
      if (SkipOp("=")) {
        KVMESH_ASSIGN_OR_RETURN(auto d, ParseExpression());
        s->defaults.push_back(std::move(d));
      } else {
        s->defaults.push_back(nullptr);
      }
    }
    return ExpectOp(")");
  }

  // Expressions, by jinja2's precedence.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr = true) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        if (!SkipOp(",")) break;
        is_tuple = true;
        if (Cur().type == T::kBlockEnd || Cur().type == T::kVariableEnd || IsOp(")") || IsName("if")) break;
      }
      if (with_condexpr) {
        KVMESH_ASSIGN_OR_RETURN(auto e, ParseExpression());
        items.push_back(std::move(e));
      } else {
        KVMESH_ASSIGN_OR_RETURN(auto e, ParseOr());
        items.push_back(std::move(e));
      }
    }
    if (!is_tuple) return std::move(items[0]);
    auto t = MakeExpr(Expr::Kind::kTuple, line);
    t->args = std::move(items);
    return t;
  }

  absl::StatusOr<ExprPtr> ParseExpression() {
    NestingGuard guard(this);
    KVMESH_RETURN_IF_ERROR(guard.status());
    KVMESH_ASSIGN_OR_RETURN(auto expr, ParseOr());
    while (SkipName("if")) {
      auto c = MakeExpr(Expr::Kind::kCondExpr, expr->line);
      KVMESH_ASSIGN_OR_RETURN(auto cond, ParseOr());
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(expr));
      if (SkipName("else")) {
        KVMESH_ASSIGN_OR_RETURN(auto other, ParseExpression());
        c->args.push_back(std::move(other));
      } else {
        c->args.push_back(nullptr);
      }
      expr = std::move(c);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    KVMESH_ASSIGN_OR_RETURN(auto left, ParseAnd());
    while (SkipName("or")) {
      KVMESH_ASSIGN_OR_RETURN(auto right, ParseAnd());
      auto e = MakeExpr(Expr::Kind::kOr, left->line);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    KVMESH_ASSIGN_OR_RETURN(auto left, ParseNot());
    while (SkipName("and")) {
      KVMESH_ASSIGN_OR_RETURN(auto right, ParseNot());
      auto e = MakeExpr(Expr::Kind::kAnd, left->line);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    NestingGuard guard(this);
    KVMESH_RETURN_IF_ERROR(guard.status());
    if (IsName("not")) {
      const int line = Cur().line;
      ++pos_;
      KVMESH_ASSIGN_OR_RETURN(auto inner, ParseNot());
      auto e = MakeExpr(Expr::Kind::kNot, line);
      e->args.push_back(std::move(inner));
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    KVMESH_ASSIGN_OR_RETURN(auto first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == T::kOperator && (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
                                         Cur().text == "<=" || Cur().text == ">" || Cur().text == ">=")) {
        op = Cur().text;
        ++pos_;
      } else if (IsName("in")) {
        op = "in";
        ++pos_;
      } else if (IsName("not") && Peek().type == T::kName && Peek().text == "in") {
        op = "notin";
        pos_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = MakeExpr(Expr::Kind::kCompare, first->line);
        cmp->args.push_back(std::move(first));
      }
      KVMESH_ASSIGN_OR_RETURN(auto next, ParseMath1());
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(next));
    }
    if (cmp) return cmp;
    return first;
  }

  ExprPtr Binary(const std::string& op, ExprPtr l, ExprPtr r) {
    auto e = MakeExpr(Expr::Kind::kBinary, l->line);
    e->name = op;
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    KVMESH_ASSIGN_OR_RETURN(auto left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const std::string op = t_[pos_++].text;
      KVMESH_ASSIGN_OR_RETURN(auto right, ParseConcat());
      left = Binary(op, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    KVMESH_ASSIGN_OR_RETURN(auto left, ParseMath2());
    while (SkipOp("~")) {
      KVMESH_ASSIGN_OR_RETURN(auto right, ParseMath2());
      left = Binary("~", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    KVMESH_ASSIGN_OR_RETURN(auto left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = t_[pos_++].text;
      KVMESH_ASSIGN_OR_RETURN(auto right, ParsePow());
      left = Binary(op, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    KVMESH_ASSIGN_OR_RETURN(auto left, ParseUnary(true));
    while (SkipOp("**")) {
      KVMESH_ASSIGN_OR_RETURN(auto right, ParseUnary(true));
      left = Binary("**", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    NestingGuard guard(this);
    KVMESH_RETURN_IF_ERROR(guard.status());
    ExprPtr node;
    const int line = Cur().line;
    if (IsOp("-") || IsOp("+")) {
      const bool neg = Cur().text == "-";
      ++pos_;
      KVMESH_ASSIGN_OR_RETURN(auto inner, ParseUnary(false));
      node = MakeExpr(neg ? Expr::Kind::kNeg : Expr::Kind::kPos, line);
      node->args.push_back(std::move(inner));
    } else {
      KVMESH_ASSIGN_OR_RETURN(auto p, ParsePrimary());
      node = std::move(p);
    }
    KVMESH_ASSIGN_OR_RETURN(auto post, ParsePostfix(std::move(node)));
    node = std::move(post);
    if (with_filter) {
      KVMESH_ASSIGN_OR_RETURN(auto f, ParseFilterExpr(std::move(node)));
      node = std::move(f);
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& tok = Cur();
    const int line = tok.line;
    switch (tok.type) {
      case T::kName: {
        ++pos_;
        auto e = MakeExpr(Expr::Kind::kLiteral, line);
        if (tok.text == "true" || tok.text == "True") {
          e->literal = Value::Bool(true);
        } else if (tok.text == "false" || tok.text == "False") {
          e->literal = Value::Bool(false);
        } else if (tok.text == "none" || tok.text == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = tok.text;
        }
        return e;
      }
      case T::kString: {
        std::string s;
        while (Cur().type == T::kString) s += t_[pos_++].text;
        auto e = MakeExpr(Expr::Kind::kLiteral, line);
        e->literal = Value::String(std::move(s));
        return e;
      }
      case T::kInt: {
        ++pos_;
        int64_t v = 0;
        if (!absl::SimpleAtoi(tok.text, &v)) return Error(line, absl::StrCat("integer out of range: ", tok.text));
        auto e = MakeExpr(Expr::Kind::kLiteral, line);
        e->literal = Value::Int(v);
        return e;
      }
      case T::kFloat: {
        ++pos_;
        auto e = MakeExpr(Expr::Kind::kLiteral, line);
        e->literal = Value::Float(std::strtod(tok.text.c_str(), nullptr));
        return e;
      }
      case T::kOperator:
        if (tok.text == "(") {
          ++pos_;
          if (SkipOp(")")) return MakeExpr(Expr::Kind::kTuple, line);
          KVMESH_ASSIGN_OR_RETURN(auto inner, ParseTuple());
          KVMESH_RETURN_IF_ERROR(ExpectOp(")"));
          return inner;
        }
        if (tok.text == "[") {
          ++pos_;
          auto e = MakeExpr(Expr::Kind::kList, line);
          while (!IsOp("]")) {
            if (!e->args.empty()) KVMESH_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("]")) break;
            KVMESH_ASSIGN_OR_RETURN(auto item, ParseExpression());
            e->args.push_back(std::move(item));
          }
          ++pos_;
          return e;
        }
        if (tok.text == "{") {
          ++pos_;
          auto e = MakeExpr(Expr::Kind::kDict, line);
          while (!IsOp("}")) {
            if (!e->args.empty()) KVMESH_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("}")) break;
            KVMESH_ASSIGN_OR_RETURN(auto key, ParseExpression());
            KVMESH_RETURN_IF_ERROR(ExpectOp(":"));
            KVMESH_ASSIGN_OR_RETURN(auto value, ParseExpression());
            e->args.push_back(std::move(key));
            e->args.push_back(std::move(value));
          }
          ++pos_;
          return e;
        }
        break;
      default:
        break;
    }
    return Error(line, absl::StrCat("unexpected ", Describe(tok), " in expression"));
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      const int line = Cur().line;
      if (SkipOp(".")) {
        auto e = MakeExpr(Expr::Kind::kGetAttr, line);
        if (Cur().type == T::kName) {
          e->name = t_[pos_++].text;
        } else if (Cur().type == T::kInt) {
          // `x.0` is x[0] in jinja2.
          e->kind = Expr::Kind::kGetItem;
          auto idx = MakeExpr(Expr::Kind::kLiteral, line);
          int64_t v = 0;
          (void)absl::SimpleAtoi(t_[pos_++].text, &v);
          idx->literal = Value::Int(v);
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(idx));
          node = std::move(e);
          continue;
        } else {
          return Error(line, absl::StrCat("expected an attribute name after '.', got ", Describe(Cur())));
        }
        e->args.push_back(std::move(node));
        node = std::move(e);
      } else if (SkipOp("[")) {
        KVMESH_ASSIGN_OR_RETURN(auto sub, ParseSubscript(std::move(node), line));
        node = std::move(sub);
      } else if (IsOp("(")) {
        KVMESH_ASSIGN_OR_RETURN(auto call, ParseCall(std::move(node)));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr obj, int line) {
    ExprPtr parts[3];
    bool is_slice = false;
    int part = 0;
    while (!IsOp("]")) {
      if (SkipOp(":")) {
        is_slice = true;
        if (++part > 2) return Error(line, "too many ':' in a slice");
        continue;
      }
      if (parts[part]) return Error(Cur().line, absl::StrCat("expected ']', got ", Describe(Cur())));
      KVMESH_ASSIGN_OR_RETURN(auto e, is_slice ? ParseExpression() : ParseTuple());
      parts[part] = std::move(e);
    }
    ++pos_;
    if (!is_slice) {
      if (!parts[0]) return Error(line, "empty subscript");
      auto e = MakeExpr(Expr::Kind::kGetItem, line);
      e->args.push_back(std::move(obj));
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    auto e = MakeExpr(Expr::Kind::kSlice, line);
    e->args.push_back(std::move(obj));
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  // Fills args[1..] and kwargs of `e` from `( ... )`.
  absl::Status ParseCallArgs(Expr* e) {
    KVMESH_RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) KVMESH_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) return Error(Cur().line, "*args and **kwargs in calls are not supported");
      if (Cur().type == T::kName && Peek().type == T::kOperator && Peek().text == "=") {
        const std::string key = Cur().text;
        pos_ += 2;
        KVMESH_ASSIGN_OR_RETURN(auto v, ParseExpression());
        e->kwargs.emplace_back(key, std::move(v));
      } else {
        if (!e->kwargs.empty()) return Error(Cur().line, "positional argument follows keyword argument");
        KVMESH_ASSIGN_OR_RETURN(auto v, ParseExpression());
        e->args.push_back(std::move(v));
      }
    }
    ++pos_;
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto e = MakeExpr(Expr::Kind::kCall, callee->line);
    e->args.push_back(std::move(callee));
    KVMESH_RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        KVMESH_ASSIGN_OR_RETURN(auto f, ParseFilterChain(std::move(node)));
        node = std::move(f);
      } else if (IsName("is")) {
        const int line = Cur().line;
        ++pos_;
        auto e = MakeExpr(Expr::Kind::kTest, line);
        e->negated = SkipName("not");
        KVMESH_ASSIGN_OR_RETURN(auto name, ExpectName());
        e->name = name;
        if (!IsKnownTest(name)) return Error(line, absl::StrCat("no test named '", name, "'"));
        e->args.push_back(std::move(node));
        if (IsOp("(")) {
          KVMESH_RETURN_IF_ERROR(ParseCallArgs(e.get()));
        } else if ((Cur().type == T::kName || Cur().type == T::kString || Cur().type == T::kInt ||
                    Cur().type == T::kFloat || IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          if (IsName("is")) return Error(Cur().line, "tests cannot be chained with 'is'");
          KVMESH_ASSIGN_OR_RETURN(auto arg, ParsePrimary());
          KVMESH_ASSIGN_OR_RETURN(auto arg2, ParsePostfix(std::move(arg)));
          e->args.push_back(std::move(arg2));
        }
        node = std::move(e);
      } else if (IsOp("(")) {
        KVMESH_ASSIGN_OR_RETURN(auto call, ParseCall(std::move(node)));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  // `| name(args) | name2 ...` applied to `input` (null for filter blocks).
  absl::StatusOr<ExprPtr> ParseFilterChain(ExprPtr input, bool leading_pipe = true) {
    bool first = true;
    while (first ? (leading_pipe ? IsOp("|") : true) : IsOp("|")) {
      if (!first || leading_pipe) ++pos_;
      first = false;
      const int line = Cur().line;
      KVMESH_ASSIGN_OR_RETURN(auto name, ExpectName());
      std::string full = name;
      while (SkipOp(".")) {  // dotted filter names
        KVMESH_ASSIGN_OR_RETURN(auto part, ExpectName());
        full += "." + part;
      }
      if (!IsKnownFilter(full)) return Error(line, absl::StrCat("no filter named '", full, "'"));
      auto e = MakeExpr(Expr::Kind::kFilter, line);
      e->name = full;
      e->args.push_back(std::move(input));
      if (IsOp("(")) KVMESH_RETURN_IF_ERROR(ParseCallArgs(e.get()));
      input = std::move(e);
    }
    return input;
  }

  const std::vector<Token>& t_;
  size_t pos_ = 0;
  int nesting_ = 0;  // NestingGuards alive
};

}  // namespace

absl::StatusOr<Body> Parse(const std::vector<Token>& tokens) { return Parser(tokens).ParseTemplate(); }

}  // namespace kvmesh::model::jinja
