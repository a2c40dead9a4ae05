#include "http/http_types.h"

#include <algorithm>

namespace kvmesh::http {

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

HttpHeaders::HttpHeaders(std::initializer_list<std::pair<std::string, std::string>> fields)
    : entries_(fields) {}

void HttpHeaders::Add(std::string name, std::string value) {
  entries_.emplace_back(std::move(name), std::move(value));
}

void HttpHeaders::Set(std::string name, std::string value) {
  Remove(name);
  Add(std::move(name), std::move(value));
}

void HttpHeaders::Remove(std::string_view name) {
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [&](const auto& e) { return EqualsIgnoreCase(e.first, name); }),
                 entries_.end());
}

std::optional<std::string_view> HttpHeaders::Get(std::string_view name) const {
  for (const auto& [n, v] : entries_) {
    if (EqualsIgnoreCase(n, name)) return std::string_view(v);
  }
  return std::nullopt;
}

std::optional<std::string> HttpRequest::QueryParam(std::string_view name) const {
  std::string_view rest = query;
  while (!rest.empty()) {
    size_t amp = rest.find('&');
    std::string_view part = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    size_t eq = part.find('=');
    std::string_view key = part.substr(0, eq);
    if (key == name) {
      return eq == std::string_view::npos ? std::string() : std::string(part.substr(eq + 1));
    }
  }
  return std::nullopt;
}

HttpResponse HttpResponse::Json(int32_t status, std::string body) {
  HttpResponse response;
  response.status = status;
  response.headers.Add("Content-Type", "application/json");
  response.body = std::move(body);
  return response;
}

HttpResponse HttpResponse::Text(int32_t status, std::string body, std::string content_type) {
  HttpResponse response;
  response.status = status;
  response.headers.Add("Content-Type", std::move(content_type));
  response.body = std::move(body);
  return response;
}

}  // namespace kvmesh::http
