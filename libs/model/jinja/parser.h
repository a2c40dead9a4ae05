// Parser: tokens to a syntax tree, checking at load time everything that can be
// checked then: statements outside the supported subset (extends, include,
// import, raw, recursive loops, ...), unknown filters and tests, unbalanced
// blocks. Every error is InvalidArgument and names the construct and its line.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "model/jinja/ast.h"
#include "model/jinja/lexer.h"

namespace kvmesh::model::jinja {

absl::StatusOr<Body> Parse(const std::vector<Token>& tokens);

}  // namespace kvmesh::model::jinja
