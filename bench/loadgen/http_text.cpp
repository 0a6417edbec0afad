// The HTTP text loadgen reads (http_text.hpp) and parse_url (loadgen.hpp).
#include "http_text.hpp"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <string>

#include "loadgen.hpp"

namespace loadgen {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return (x | 0x20) == (y | 0x20);
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Responses must carry Content-Length (chunked ones are reported as bad).

}  // namespace

Head parse_head(std::string_view in) {
  Head h;
  const std::size_t end = in.find("\r\n\r\n");
  if (end == std::string_view::npos) return h;
  std::string_view head = in.substr(0, end);
  const std::size_t eol = head.find("\r\n");
  const std::string_view line = head.substr(0, eol);
  if (line.size() < 12 || line.substr(0, 5) != "HTTP/") {
    h.bad = true;
    return h;
  }
  h.status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
  bool have_length = false;
  std::size_t pos = eol == std::string_view::npos ? head.size() : eol + 2;
  while (pos < head.size()) {
    std::size_t next = head.find("\r\n", pos);
    if (next == std::string_view::npos) next = head.size();
    const std::string_view field = head.substr(pos, next - pos);
    pos = next + 2;
    const std::size_t colon = field.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = field.substr(0, colon);
    const std::string_view value = trim(field.substr(colon + 1));
    if (iequals(name, "content-length")) {
      std::size_t n = 0;
      for (char c : value) {
        if (c < '0' || c > '9') {
          h.bad = true;
          return h;
        }
        n = n * 10 + static_cast<std::size_t>(c - '0');
      }
      h.length = n;
      have_length = true;
    } else if (iequals(name, "connection")) {
      h.close = iequals(value, "close");
    } else if (iequals(name, "transfer-encoding")) {
      h.bad = true;
      return h;
    }
  }
  if (!have_length) {
    h.bad = true;
    return h;
  }
  h.body_at = end + 4;
  h.length += h.body_at;
  h.complete = in.size() >= h.length;
  return h;
}

std::string_view body_reason(std::string_view body) {
  constexpr std::string_view key = "\"reason\":\"";
  const std::size_t at = body.find(key);
  if (at == std::string_view::npos) return {};
  const std::size_t start = at + key.size();
  const std::size_t end = body.find('"', start);
  if (end == std::string_view::npos || end - start > 40) return {};
  return body.substr(start, end - start);
}

bool parse_url(const std::string& url, Target& out) {
  constexpr std::string_view scheme = "http://";
  if (url.compare(0, scheme.size(), scheme) != 0) return false;
  std::string rest = url.substr(scheme.size());
  const std::size_t slash = rest.find('/');
  out.path = slash == std::string::npos ? "/" : rest.substr(slash);
  std::string hostport = rest.substr(0, slash);
  if (hostport.empty()) return false;
  std::size_t colon = std::string::npos;
  if (hostport.front() == '[') {  // [v6]:port
    const std::size_t close = hostport.find(']');
    if (close == std::string::npos) return false;
    out.host = hostport.substr(1, close - 1);
    if (close + 1 < hostport.size() && hostport[close + 1] == ':') colon = close + 1;
  } else {
    colon = hostport.rfind(':');
    out.host = hostport.substr(0, colon);
  }
  out.port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  return !out.host.empty() && !out.port.empty();
}

}  // namespace loadgen
