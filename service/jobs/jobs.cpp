#include "jobs/jobs.hpp"

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>
#include <string>

namespace crewd {
namespace {

using Json = nlohmann::json;

std::string range_message(std::string_view field, std::uint64_t lo, std::uint64_t hi) {
  return std::string(field) + " must be an integer in " + std::to_string(lo) + ".." +
         std::to_string(hi);
}

// An integer field in lo..hi. Floats (1.0, 1e3), booleans, strings and
// negative numbers are refused: silently truncating them would run a job the
// client did not ask for.
bool read_bounded(const Json& value, std::uint64_t lo, std::uint64_t hi, std::uint32_t& out) {
  if (!value.is_number_unsigned()) return false;  // nlohmann: non-negative integers only
  const auto v = value.get<std::uint64_t>();
  if (v < lo || v > hi) return false;
  out = static_cast<std::uint32_t>(v);
  return true;
}

bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxJobNameLength) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '-';
  });
}

// Field names are client input too: quote them only if they are short and
// printable ASCII, so an error message is always valid UTF-8 JSON.
std::string quoted_field(std::string_view key) {
  const bool printable = key.size() <= 32 && std::all_of(key.begin(), key.end(), [](char c) {
                           return c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
                         });
  return printable ? "'" + std::string(key) + "'" : "(unprintable or longer than 32 bytes)";
}

}  // namespace

std::string_view to_string(JobKind kind) noexcept {
  switch (kind) {
    case JobKind::sleep:
      return "sleep";
    case JobKind::spin:
      return "spin";
    case JobKind::stuck:
      return "stuck";
    case JobKind::call:
      return "call";
  }
  return "?";
}

std::string_view to_string(JobPriority p) noexcept {
  switch (p) {
    case JobPriority::low:
      return "low";
    case JobPriority::normal:
      return "normal";
    case JobPriority::high:
      return "high";
  }
  return "?";
}

std::variant<JobHeaders, ParseError> parse_job_headers(
    const std::optional<std::string>& priority, const std::optional<std::string>& deadline_ms,
    const JobLimits& limits) {
  JobHeaders out;
  if (priority) {
    const auto is = [&](std::string_view name) {
      return priority->size() == name.size() &&
             std::equal(name.begin(), name.end(), priority->begin(), [](char a, char b) {
               return a == (b >= 'A' && b <= 'Z' ? static_cast<char>(b - 'A' + 'a') : b);
             });
    };
    if (is("low") || *priority == "0") {
      out.priority = JobPriority::low;
    } else if (is("normal") || *priority == "1") {
      out.priority = JobPriority::normal;
    } else if (is("high") || *priority == "2") {
      out.priority = JobPriority::high;
    } else {
      return ParseError{"X-Priority must be high, normal or low, or a level in 0.." +
                        std::to_string(kJobPriorityLevels - 1)};
    }
  }
  if (deadline_ms) {
    std::uint32_t v = 0;
    const char* end = deadline_ms->data() + deadline_ms->size();
    const auto [at, ec] = std::from_chars(deadline_ms->data(), end, v);
    // The whole value: from_chars alone would take a prefix ("5ms"); for an
    // unsigned type it takes no sign.
    if (ec != std::errc{} || at != end || v < 1 || v > limits.max_timeout_ms) {
      return ParseError{range_message("X-Deadline-Ms", 1, limits.max_timeout_ms)};
    }
    out.deadline_ms = v;
  }
  return out;
}

std::variant<unsigned, ParseError> parse_factorial_n(std::string_view segment) {
  const auto bad = [] {
    return ParseError{range_message("n", 0, kMaxFactorialN) + " (larger ones overflow uint64)"};
  };
  // from_chars alone would accept a leading '-' for signed types and stop at
  // the first non-digit; demand digits from start to end. Leading zeros are
  // fine, however many (the segment's length is bounded by http.header_limit).
  if (segment.empty() ||
      !std::all_of(segment.begin(), segment.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return bad();
  }
  segment.remove_prefix(std::min(segment.find_first_not_of('0'), segment.size() - 1));
  if (segment.size() > 2) return bad();  // > 99
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(segment.data(), segment.data() + segment.size(), n);
  if (ec != std::errc{} || end != segment.data() + segment.size() || n > kMaxFactorialN) {
    return bad();
  }
  return static_cast<unsigned>(n);
}

std::variant<JobRequest, ParseError> parse_job_request(std::string_view body,
                                                       const JobLimits& limits) {
  // nlohmann's lexer takes a NUL byte for the end of the input: a body
  // `{...}\0anything` would parse. JSON has no raw NUL (RFC 8259: not
  // whitespace, and escaped inside strings).
  if (body.find('\0') != std::string_view::npos) return ParseError{"body is not valid JSON"};
  // No exceptions: a malformed body yields a discarded value. nlohmann's
  // parser keeps its own stack, so deep nesting cannot overflow ours.
  const Json doc = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return ParseError{"body is not valid JSON"};
  if (!doc.is_object()) return ParseError{"body must be a JSON object"};

  JobRequest req;
  bool have_kind = false;
  bool have_ms = false;
  bool have_timeout = false;
  for (const auto& [key, value] : doc.items()) {
    if (key == "kind") {
      const auto* s = value.get_ptr<const Json::string_t*>();
      if (s != nullptr && *s == "sleep") {
        req.kind = JobKind::sleep;
      } else if (s != nullptr && *s == "spin") {
        req.kind = JobKind::spin;
      } else if (s != nullptr && *s == "stuck" && limits.allow_stuck) {
        req.kind = JobKind::stuck;
      } else if (s != nullptr && *s == "call" && limits.allow_call) {
        req.kind = JobKind::call;
      } else if (s != nullptr && *s == "call") {
        return ParseError{"kind \"call\" needs a downstream: jobs.call_url is not set"};
      } else {
        return ParseError{limits.allow_call ? "kind must be \"sleep\", \"spin\" or \"call\""
                                            : "kind must be \"sleep\" or \"spin\""};
      }
      have_kind = true;
    } else if (key == "ms") {
      if (!read_bounded(value, 0, limits.max_ms, req.ms)) {
        return ParseError{range_message("ms", 0, limits.max_ms)};
      }
      have_ms = true;
    } else if (key == "timeout_ms") {
      if (!read_bounded(value, 1, limits.max_timeout_ms, req.timeout_ms)) {
        return ParseError{range_message("timeout_ms", 1, limits.max_timeout_ms)};
      }
      have_timeout = true;
    } else if (key == "name") {
      const auto* s = value.get_ptr<const Json::string_t*>();
      if (s == nullptr || !valid_name(*s)) {
        return ParseError{"name must be a string of 1.." + std::to_string(kMaxJobNameLength) +
                          " characters from [A-Za-z0-9._:-]"};
      }
      req.name = *s;
    } else {
      return ParseError{"unknown field " + quoted_field(key) +
                        " (fields: kind, ms, timeout_ms, name)"};
    }
  }
  if (!have_kind) return ParseError{"kind is required (\"sleep\" or \"spin\")"};
  if (req.kind == JobKind::call && have_ms) {
    return ParseError{"ms does not apply to kind \"call\" (it waits for the downstream's answer)"};
  }
  if (!have_ms && req.kind != JobKind::call) {
    return ParseError{"ms is required: " + range_message("ms", 0, limits.max_ms)};
  }
  if (!have_timeout) req.timeout_ms = limits.default_timeout_ms;
  if (req.name.empty()) req.name = std::string(to_string(req.kind));
  return req;
}

std::optional<HttpUrl> parse_http_url(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (url.size() > 2048 || url.substr(0, kScheme.size()) != kScheme) return std::nullopt;
  url.remove_prefix(kScheme.size());
  const std::size_t slash = url.find('/');
  const std::string_view authority = url.substr(0, slash);
  HttpUrl out;
  if (slash != std::string_view::npos) out.target = std::string(url.substr(slash));
  // Visible ASCII only, and no query or fragment: the target is sent as it is.
  if (!std::all_of(out.target.begin(), out.target.end(),
                   [](char c) { return c > 0x20 && c < 0x7f && c != '?' && c != '#'; })) {
    return std::nullopt;
  }
  const std::size_t colon = authority.rfind(':');
  const std::string_view host = authority.substr(0, colon);
  if (colon != std::string_view::npos) {
    const std::string_view digits = authority.substr(colon + 1);
    std::uint32_t port = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
    if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size() || port < 1 ||
        port > 65535) {
      return std::nullopt;
    }
    out.port = static_cast<std::uint16_t>(port);
  }
  if (host.empty() || host.size() > 253 || !std::all_of(host.begin(), host.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '-';
      })) {
    return std::nullopt;
  }
  out.host = std::string(host);
  return out;
}

}  // namespace crewd
