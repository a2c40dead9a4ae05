#include "model/internal/regex.h"

#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "model/internal/utf8.h"

namespace kvmesh::model::internal {
namespace {

// Per-thread scratch: PCRE2 match data and a JIT stack large enough for long
// whitespace runs (the default 32 KiB stack overflows on tokenizer patterns).
struct MatchScratch {
  MatchScratch() {
    match_data = pcre2_match_data_create(32, nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_data_free(match_data);
  }
  pcre2_match_data* match_data;
  pcre2_jit_stack* jit_stack;
  pcre2_match_context* context;
};

MatchScratch& Scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

}  // namespace

std::string Regex::TranslatePattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  int class_depth = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[i + 1];
      ++i;
      if (n == 's') {
        out += class_depth > 0 ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (n == 'S' && class_depth == 0) {
        out += "[^\\s\\x{85}]";
      } else {
        out.push_back('\\');
        out.push_back(n);
      }
      continue;
    }
    if (c == '[') {
      // A POSIX class like [:alpha:] inside a class is not a nested class.
      if (class_depth > 0 && i + 1 < pattern.size() && pattern[i + 1] == ':') {
        const size_t close = pattern.find(":]", i + 2);
        if (close != std::string_view::npos) {
          out.append(pattern.substr(i, close + 2 - i));
          i = close + 1;
          continue;
        }
      }
      ++class_depth;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') {
        out.push_back('^');
        ++i;
      }
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') {
        out.push_back(']');
        ++i;
      }
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  const std::string translated = TranslatePattern(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("regex '", absl::string_view(pattern.data(), pattern.size()),
                                                   "' does not compile: ", reinterpret_cast<const char*>(message),
                                                   " at offset ", error_offset));
  }
  // JIT is an optimisation: without it (unsupported CPU) pcre2_match interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(code));
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Literal(std::string_view literal) {
  std::string quoted = "\\Q";
  // \Q...\E cannot hold "\E": split it.
  for (size_t i = 0; i < literal.size(); ++i) {
    if (literal[i] == '\\' && i + 1 < literal.size() && literal[i + 1] == 'E') {
      quoted += "\\E\\\\\\QE";
      ++i;
    } else {
      quoted.push_back(literal[i]);
    }
  }
  quoted += "\\E";
  return Compile(quoted);
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchScratch& scratch = Scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, scratch.match_data,
                               scratch.context);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a resource limit: no further matches.
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.match_data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    matches->emplace_back(begin, end);
    if (end > begin) {
      start = end;
    } else {
      if (end >= text.size()) break;
      start = end + Utf8LeadLength(static_cast<unsigned char>(text[end]));
    }
  }
}

}  // namespace kvmesh::model::internal
