// Template: a compiled Jinja template, the subset of jinja2 that Hugging Face
// chat templates use, rendered with jinja2's semantics byte for byte. kvmesh
// carries its own interpreter because Debian packages no C++ Jinja library.
//
// Supported: text, {{ }}, comments, whitespace control (`-`, `+`, trim_blocks,
// lstrip_blocks); statements for (loop.*, else, `if` filter), if/elif/else, set
// (plain, tuple, `ns.attr`, block), macro (defaults, varargs, kwargs, caller),
// call, filter, break/continue (jinja2.ext.loopcontrols, which transformers
// enables) and generation; the full expression grammar; the filters, tests,
// str and dict methods in builtins.h; range, namespace and dict. Anything else
// is an error from Parse naming the construct and its line.
//
// Thread-safety: a Template is immutable once parsed; Render may run
// concurrently from many threads. Copies share the parsed tree.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/jinja/ast.h"
#include "model/jinja/lexer.h"
#include "model/jinja/value.h"

namespace kvmesh::model::jinja {

class Template {
 public:
  // InvalidArgument "chat template line N: ..." for a syntax error or a
  // construct outside the subset.
  static absl::StatusOr<Template> Parse(const std::string& source, const LexerOptions& options = {});

  // Renders with `globals` (besides range, namespace, dict) as the template's
  // variables. InvalidArgument for a runtime error (an operation on an
  // undefined value, a type error, raise_exception's message).
  absl::StatusOr<std::string> Render(const std::vector<std::pair<std::string, Value>>& globals) const;

 private:
  explicit Template(std::shared_ptr<const Body> body) : body_(std::move(body)) {}
  std::shared_ptr<const Body> body_;
};

}  // namespace kvmesh::model::jinja
