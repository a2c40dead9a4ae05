#include "model/jinja/lexer.h"

#include <cctype>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "model/internal/utf8.h"

namespace kvmesh::model::jinja {
namespace {

std::string NormalizeNewlines(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

int CountLines(const std::string& s, size_t from, size_t to) {
  int n = 0;
  for (size_t i = from; i < to && i < s.size(); ++i) n += s[i] == '\n' ? 1 : 0;
  return n;
}

// Python's str.rstrip() on UTF-8.
std::string RStripPython(const std::string& s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t p = start;
    if (!internal::IsPythonSpace(internal::DecodeUtf8(s, &p))) break;
    end = start;
  }
  return s.substr(0, end);
}

// Skips whitespace after a `-` end delimiter (jinja2's `\s*`, Unicode-aware).
size_t SkipPythonSpace(const std::string& s, size_t pos) {
  while (pos < s.size()) {
    size_t p = pos;
    if (!internal::IsPythonSpace(internal::DecodeUtf8(s, &p))) break;
    pos = p;
  }
  return pos;
}

absl::Status Error(int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

class Lexer {
 public:
  Lexer(std::string src, const LexerOptions& options) : src_(std::move(src)), options_(options) {}

  absl::StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t tag = FindTag(pos_);
      std::string text = src_.substr(pos_, tag == std::string::npos ? std::string::npos : tag - pos_);
      if (tag == std::string::npos) {
        EmitText(text);
        pos_ = src_.size();
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        text = RStripPython(text);
      } else if (sign != '+' && kind != '{' && options_.lstrip_blocks) {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (l_pos > 0 || line_starting) {
          bool only_blank = true;
          for (size_t i = l_pos; i < text.size(); ++i) {
            if (text[i] != ' ' && text[i] != '\t') only_blank = false;
          }
          if (only_blank) text.resize(l_pos);
        }
      }
      EmitText(text);
      line_ += CountLines(src_, pos_, tag);
      pos_ = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      absl::Status s = kind == '#' ? LexComment() : LexTag(kind);
      if (!s.ok()) return s;
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back({Token::Type::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t FindTag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  void EmitText(const std::string& text) {
    if (!text.empty()) tokens_.push_back({Token::Type::kText, text, line_});
  }

  // After the closing delimiter: `-` strips whitespace, otherwise trim_blocks
  // drops one newline after block tags and comments (`+` keeps it).
  void AfterEnd(char sign, bool is_block) {
    if (sign == '-') {
      const size_t next = SkipPythonSpace(src_, pos_);
      line_ += CountLines(src_, pos_, next);
      pos_ = next;
    } else if (sign != '+' && is_block && options_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
    }
  }

  absl::Status LexComment() {
    const int start_line = line_;
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) return Error(start_line, "unterminated comment");
    const char sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : '\0';
    line_ += CountLines(src_, pos_, end);
    pos_ = end + 2;
    AfterEnd(sign, /*is_block=*/true);
    return absl::OkStatus();
  }

  absl::Status LexTag(char kind) {
    const bool block = kind == '%';
    const int start_line = line_;
    tokens_.push_back({block ? Token::Type::kBlockBegin : Token::Type::kVariableBegin, "", line_});
    const char close = block ? '%' : '}';
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos_]))) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) return Error(start_line, block ? "unterminated {% tag" : "unterminated {{ tag");
      const char c = src_[pos_];
      // The closing delimiter, with an optional whitespace sign, when no bracket is open.
      if (depth == 0) {
        char sign = '\0';
        size_t p = pos_;
        if ((c == '-' || c == '+') && p + 2 < src_.size() + 0 && src_[p + 1] == close && src_[p + 2] == '}') {
          sign = c;
          ++p;
        }
        if (p + 1 < src_.size() && src_[p] == close && src_[p + 1] == '}') {
          pos_ = p + 2;
          tokens_.push_back({block ? Token::Type::kBlockEnd : Token::Type::kVariableEnd, "", line_});
          AfterEnd(sign, block);
          return absl::OkStatus();
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        tokens_.push_back({Token::Type::kName, src_.substr(pos_, e - pos_), line_});
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos_;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        bool is_float = false;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t f = e + 1;
          if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
          if (f < src_.size() && std::isdigit(static_cast<unsigned char>(src_[f]))) {
            is_float = true;
            e = f;
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        std::string num;
        for (size_t i = pos_; i < e; ++i) {
          if (src_[i] != '_') num.push_back(src_[i]);
        }
        tokens_.push_back({is_float ? Token::Type::kFloat : Token::Type::kInt, num, line_});
        pos_ = e;
      } else if (c == '\'' || c == '"') {
        absl::Status s = LexString(c);
        if (!s.ok()) return s;
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                     ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|"};
        bool matched = false;
        for (const char* op : kOps) {
          const size_t n = std::strlen(op);
          if (src_.compare(pos_, n, op) == 0) {
            tokens_.push_back({Token::Type::kOperator, op, line_});
            pos_ += n;
            if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
            if ((op[0] == ')' || op[0] == ']' || op[0] == '}') && depth > 0) --depth;
            matched = true;
            break;
          }
        }
        if (!matched) return Error(line_, absl::StrCat("unexpected character '", std::string(1, c), "'"));
      }
    }
  }

  absl::Status LexString(char quote) {
    const int start_line = line_;
    std::string out;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= src_.size()) return Error(start_line, "unterminated string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\' || p + 1 >= src_.size()) {
        out.push_back(c);
        ++p;
        continue;
      }
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'v': out.push_back('\v'); break;
        case 'a': out.push_back('\a'); break;
        case '0': out.push_back('\0'); break;
        case '\n': ++line_; break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          if (p + n > src_.size()) return Error(line_, "truncated escape in string literal");
          char32_t cp = 0;
          for (size_t i = 0; i < n; ++i) {
            const char h = src_[p + i];
            if (!std::isxdigit(static_cast<unsigned char>(h))) return Error(line_, "bad escape in string literal");
            cp = cp * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                                             : (std::tolower(h) - 'a' + 10));
          }
          internal::AppendUtf8(cp, &out);
          p += n;
          break;
        }
        default:  // Python keeps unknown escapes as written.
          out.push_back('\\');
          out.push_back(e);
      }
    }
    tokens_.push_back({Token::Type::kString, out, start_line});
    pos_ = p + 1;
    return absl::OkStatus();
  }

  std::string src_;
  LexerOptions options_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(const std::string& source, const LexerOptions& options) {
  std::string src = NormalizeNewlines(source);
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src), options).Run();
}

}  // namespace kvmesh::model::jinja
