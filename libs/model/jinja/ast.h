// The syntax tree the parser builds and the interpreter walks. One node type
// per level (expression, statement); which fields a node uses depends on its
// kind, as listed beside each kind.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/jinja/value.h"

namespace kvmesh::model::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // args: items
    kTuple,     // args: items
    kDict,      // args: key0, value0, key1, value1, ...
    kGetAttr,   // args[0].name
    kGetItem,   // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]] (null when left out)
    kCall,      // args[0](args[1..], kwargs)
    kFilter,    // args[0] | name(args[1..], kwargs); args[0] null in a filter block
    kTest,      // args[0] is [not] name(args[1..])
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kNot,       // not args[0]
    kBinary,    // args[0] name args[1]: + - * / // % ** ~
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
    kCondExpr,  // args[1] if args[0] else args[2] (null: undefined)
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches (cond null for else)
    kFor,          // for targets in expr [if cond]: body [else else_body]
    kSet,          // set targets = expr, or set targets[0].attr = expr
    kSetBlock,     // set targets[0] [| filter]: body
    kMacro,        // macro name(params = defaults): body
    kCallBlock,    // call[(params)] expr: body (the body is `caller`)
    kFilterBlock,  // filter expr (a kFilter chain on null): body
    kBreak,
    kContinue,
    kGeneration,   // transformers' {% generation %}: body rendered as is
  };
  Kind kind;
  int line = 0;
  std::string text;
  std::string name;
  std::string attr;
  ExprPtr expr;
  ExprPtr cond;
  ExprPtr filter;  // kSetBlock's optional filter chain
  std::vector<std::string> targets;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param, null where none
  Body body;
  Body else_body;
  std::vector<std::pair<ExprPtr, Body>> branches;
};

}  // namespace kvmesh::model::jinja
