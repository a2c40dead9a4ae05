// Lexer: splits Jinja source into text and the tokens inside {{ }} and {% %},
// applying jinja2's whitespace rules as transformers configures them:
// trim_blocks (the first newline after a block tag or comment is dropped),
// lstrip_blocks (spaces and tabs before a block tag or comment at the start of
// a line are dropped), `-` on a delimiter strips all whitespace on that side,
// `+` turns the two options off for that side, newlines are normalised to \n
// and one trailing newline of the source is dropped (keep_trailing_newline=False).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvmesh::model::jinja {

struct Token {
  enum class Type { kText, kVariableBegin, kVariableEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat,
                    kOperator, kEnd };
  Type type;
  std::string text;  // text, name, operator, or the decoded string literal / number spelling
  int line = 1;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// InvalidArgument naming the line for an unterminated tag, comment or string,
// or a character no Jinja token starts with.
absl::StatusOr<std::vector<Token>> Tokenize(const std::string& source, const LexerOptions& options);

}  // namespace kvmesh::model::jinja
