// Value checks and the checks across settings (service/config/config_validate.hpp).
#include "config/config_validate.hpp"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace crewd {

std::optional<std::uint64_t> parse_uint(std::string_view text) {
  if (text.empty() ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return v;
}

// A Redis key or name: 1..256 printable ASCII characters, no spaces.
std::optional<std::string> check_redis_name(std::string_view v) {
  const bool ok = !v.empty() && v.size() <= 256 &&
                  std::all_of(v.begin(), v.end(), [](char ch) { return ch > 0x20 && ch < 0x7f; });
  if (ok) return std::nullopt;
  return "must be 1..256 printable ASCII characters without spaces";
}

std::optional<std::string> check_consumer(std::string_view v) {
  if (v.empty()) return std::nullopt;  // the default: <host name>-<pid>
  return check_redis_name(v);
}

std::optional<std::string> check_anything(std::string_view /*v*/) { return std::nullopt; }

// HOST:PORT of Redis, or empty (off).
std::optional<std::string> check_redis_address(std::string_view v) {
  if (v.empty()) return std::nullopt;
  const auto colon = v.rfind(':');
  const auto port =
      colon == std::string_view::npos ? std::nullopt : parse_uint(v.substr(colon + 1));
  const std::string_view host = v.substr(0, colon == std::string_view::npos ? 0 : colon);
  const bool host_ok = !host.empty() && std::all_of(host.begin(), host.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '.' || ch == '-' || ch == '_';
  });
  if (host_ok && port && *port >= 1 && *port <= 65535) return std::nullopt;
  return "must be HOST:PORT with a port in 1..65535, or empty (no Redis)";
}

std::optional<std::string> check_call_url(std::string_view v) {
  if (v.empty() || parse_http_url(v)) return std::nullopt;
  return "must be http://HOST[:PORT]/PATH (an IPv4 address or a name, a port in 1..65535, a path "
         "of visible ASCII without query or fragment), or empty (no call jobs)";
}

std::optional<std::string> check_ui_address(std::string_view v) {
  if (v.empty()) return std::nullopt;
  boost::system::error_code ec;
  (void)boost::asio::ip::make_address(std::string(v), ec);
  if (!ec) return std::nullopt;
  return "must be a numeric IPv4 or IPv6 address of this host, or empty (loopback only)";
}

std::optional<std::string> check_ui_token(std::string_view v) {
  const bool chars_ok = std::all_of(v.begin(), v.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '-' || ch == '.' ||
           ch == '_' || ch == '~' || ch == '+' || ch == '/' || ch == '=';
  });
  if (v.empty() || (v.size() >= 16 && v.size() <= 256 && chars_ok)) return std::nullopt;
  return "must be empty or 16..256 characters of [A-Za-z0-9-._~+/=]";
}

// "HOST:PORT" or "[IPV6]:PORT". The host is an IPv4 address, a name, or
// (in brackets) an IPv6 address; load_config resolves it at the end.
std::optional<std::string> set_listen(Config& c, std::string_view text) {
  static const std::string must =
      "must be HOST:PORT or [IPV6]:PORT with a port in 0..65535 (0: any free port)";
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return must;
  std::string_view host = text.substr(0, colon);
  const auto port = parse_uint(text.substr(colon + 1));
  if (!port || *port > 65535) return must;
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return must;
    host = host.substr(1, host.size() - 2);
    if (!std::all_of(host.begin(), host.end(),
                     [](char ch) {
                       return std::isxdigit(static_cast<unsigned char>(ch)) != 0 || ch == ':' ||
                              ch == '.' || ch == '%' ||
                              std::isalnum(static_cast<unsigned char>(ch)) != 0;
                     }) ||
        host.find(':') == std::string_view::npos) {
      return must;
    }
  } else if (!std::all_of(host.begin(), host.end(), [](char ch) {
               return std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '.' || ch == '-' ||
                      ch == '_';
             })) {
    return must;
  }
  c.host = std::string(host);
  c.port = static_cast<std::uint16_t>(*port);
  return std::nullopt;
}

// Settings that are fine alone but not together.
std::optional<std::string> cross_check(const Config& c) {
  const auto ms = [](Millis d) { return std::to_string(d.count()); };
  if (c.shutdown.timeout >= c.shutdown.termination_timeout) {
    return "shutdown.timeout_ms (" + ms(c.shutdown.timeout) +
           ") must be less than shutdown.termination_timeout_ms (" +
           ms(c.shutdown.termination_timeout) +
           "): the pools must have stopped before crewd gives up on the graceful path";
  }
  if (c.shutdown.admit_grace >= c.shutdown.termination_timeout) {
    return "shutdown.admit_grace_ms (" + ms(c.shutdown.admit_grace) +
           ") must be less than shutdown.termination_timeout_ms (" +
           ms(c.shutdown.termination_timeout) + ")";
  }
  if (c.jobs.limits.default_timeout_ms > c.jobs.limits.max_timeout_ms) {
    return "jobs.default_timeout_ms (" + std::to_string(c.jobs.limits.default_timeout_ms) +
           ") must not exceed jobs.max_timeout_ms (" +
           std::to_string(c.jobs.limits.max_timeout_ms) + ")";
  }
  if (!c.redis.address.empty()) {
#if !CREWD_REDIS
    return "redis.address is set, but this crewd was built without Redis support (hiredis)";
#endif
    if (c.redis.in_flight > c.jobs.workers + c.jobs.queue) {
      return "redis.in_flight (" + std::to_string(c.redis.in_flight) +
             ") must not exceed jobs.workers + jobs.queue (" +
             std::to_string(c.jobs.workers + c.jobs.queue) +
             "): the jobs pool would refuse what was taken";
    }
    const std::string& r = c.redis.results_stream;
    const std::string& d = c.redis.dead_letter_stream;
    if (c.redis.stream == r || c.redis.stream == d || r == d) {
      return "redis.stream, redis.results_stream and redis.dead_letter_stream must differ";
    }
  }
  return std::nullopt;
}

std::string resolve_error(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc == 0) {
    ::freeaddrinfo(found);
    return {};
  }
  return rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc);
}

}  // namespace crewd
