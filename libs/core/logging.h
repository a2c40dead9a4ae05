// Structured logging: one line per event, `time level file:line message key=value...`.
// Lines go to stderr; the level threshold comes from KVMESH_LOG_LEVEL
// (debug|info|warning|error, default info) or SetLogLevel().
//
//   KVMESH_LOG(kInfo) << "model loaded" << LogKv("seconds", 1.2);
//
// Thread-safety: thread-safe; each line is written with one call.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace kvmesh {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "info", "warning" or "error"; false for anything else.
bool ParseLogLevel(std::string_view text, LogLevel* level);

// A `key=value` field; strings with spaces are quoted.
struct LogKvField {
  std::string text;
};
template <typename T>
LogKvField LogKv(std::string_view key, const T& value) {
  std::ostringstream out;
  out << value;
  std::string v = out.str();
  if (v.find_first_of(" \"=") != std::string::npos || v.empty()) {
    std::string quoted = "\"";
    for (char c : v) {
      if (c == '"' || c == '\\') quoted += '\\';
      quoted += c;
    }
    v = quoted + "\"";
  }
  return LogKvField{std::string(key) + "=" + v};
}

namespace internal {
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  template <typename T>
  LogLine& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  LogLine& operator<<(const LogKvField& field) {
    stream_ << ' ' << field.text;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal

}  // namespace kvmesh

#define KVMESH_LOG(level)                                                   \
  if (::kvmesh::LogLevel::level < ::kvmesh::GetLogLevel()) {                \
  } else                                                                    \
    ::kvmesh::internal::LogLine(::kvmesh::LogLevel::level, __FILE__, __LINE__)
