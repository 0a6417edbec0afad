#include "config.hpp"

#include <netdb.h>
#include <sys/socket.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>

namespace crewd {
namespace {

enum class Source : std::uint8_t { defaults, file, env, flag };

// One setting: its key, its help line, and how to read and show its value.
// The readers return an error message (what the value must be), or nothing.
struct Setting {
  std::string key;
  std::string help;
  std::function<std::optional<std::string>(Config&, std::string_view)> from_text;
  std::function<std::optional<std::string>(Config&, const toml::node&)> from_toml;
  std::function<std::string(const Config&)> show;  // as a TOML value
};

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

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

template <class T>
inline constexpr bool kIsDuration = false;
template <class Rep, class Period>
inline constexpr bool kIsDuration<std::chrono::duration<Rep, Period>> = true;

// Durations are read and shown as a count of their own unit (ms, s).
template <class T>
std::uint64_t as_u64(const T& v) {
  if constexpr (kIsDuration<T>) {
    return static_cast<std::uint64_t>(v.count());
  } else {
    return static_cast<std::uint64_t>(v);
  }
}

template <class T>
T from_u64(std::uint64_t v) {
  if constexpr (kIsDuration<T>) {
    return T(static_cast<typename T::rep>(v));
  } else {
    return static_cast<T>(v);
  }
}

// An integer (count, bytes, milliseconds) in lo..hi.
template <class Field>
Setting integer(std::string key, std::string help, Field& (*get)(Config&), std::uint64_t lo,
                std::uint64_t hi) {
  using T = std::remove_reference_t<Field>;
  const std::string must =
      "must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
  auto set = [get, lo, hi, must](Config& c, std::uint64_t v) -> std::optional<std::string> {
    if (v < lo || v > hi) return must;
    get(c) = from_u64<T>(v);
    return std::nullopt;
  };
  return Setting{std::move(key), std::move(help),
                 [set, must](Config& c, std::string_view text) -> std::optional<std::string> {
                   const auto v = parse_uint(text);
                   if (!v) return must;
                   return set(c, *v);
                 },
                 [set, must](Config& c, const toml::node& node) -> std::optional<std::string> {
                   const auto v = node.value_exact<std::int64_t>();
                   if (!v || *v < 0) return must;
                   return set(c, static_cast<std::uint64_t>(*v));
                 },
                 [get](const Config& c) {
                   Config copy = c;  // the accessor hands out a mutable reference
                   return std::to_string(as_u64(get(copy)));
                 }};
}

// A value from a fixed list of names.
template <class T>
Setting choice(std::string key, std::string help, T& (*get)(Config&),
               std::vector<std::pair<std::string, T>> names) {
  std::string must = "must be one of";
  for (std::size_t i = 0; i < names.size(); ++i) {
    must += (i == 0 ? " " : ", ") + names[i].first;
  }
  auto set = [get, names, must](Config& c, std::string_view text) -> std::optional<std::string> {
    for (const auto& [name, value] : names) {
      if (text == name) {
        get(c) = value;
        return std::nullopt;
      }
    }
    return must;
  };
  return Setting{std::move(key), std::move(help), set,
                 [set, must](Config& c, const toml::node& node) -> std::optional<std::string> {
                   const auto v = node.value_exact<std::string>();
                   if (!v) return must;
                   return set(c, *v);
                 },
                 [get, names](const Config& c) {
                   Config copy = c;  // the accessor hands out a mutable reference
                   for (const auto& [name, value] : names) {
                     if (get(copy) == value) return toml_string(name);
                   }
                   return std::string("\"?\"");
                 }};
}

// true / false (also 1 / 0 in the environment and on the command line).
Setting boolean(std::string key, std::string help, bool& (*get)(Config&)) {
  static const std::string must = "must be true or false";
  return Setting{std::move(key), std::move(help),
                 [get](Config& c, std::string_view text) -> std::optional<std::string> {
                   if (text == "true" || text == "1") {
                     get(c) = true;
                   } else if (text == "false" || text == "0") {
                     get(c) = false;
                   } else {
                     return must;
                   }
                   return std::nullopt;
                 },
                 [get](Config& c, const toml::node& node) -> std::optional<std::string> {
                   const auto v = node.value_exact<bool>();
                   if (!v) return must;
                   get(c) = *v;
                   return std::nullopt;
                 },
                 [get](const Config& c) {
                   Config copy = c;  // the accessor hands out a mutable reference
                   return std::string(get(copy) ? "true" : "false");
                 }};
}

// A string; `check` says what it must be when it is not. A secret is shown
// as "(hidden)" once set, so that --print-config does not leak it.
Setting text(std::string key, std::string help, std::string& (*get)(Config&),
             std::optional<std::string> (*check)(std::string_view), bool secret = false) {
  auto set = [get, check](Config& c, std::string_view value) -> std::optional<std::string> {
    if (auto err = check(value)) return err;
    get(c) = std::string(value);
    return std::nullopt;
  };
  return Setting{std::move(key), std::move(help), set,
                 [set](Config& c, const toml::node& node) -> std::optional<std::string> {
                   const auto v = node.value_exact<std::string>();
                   if (!v) return "must be a string";
                   return set(c, *v);
                 },
                 [get, secret](const Config& c) {
                   Config copy = c;  // the accessor hands out a mutable reference
                   const std::string& v = get(copy);
                   return toml_string(secret && !v.empty() ? "(hidden)" : v);
                 }};
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

std::optional<std::string> check_anything(std::string_view) { return std::nullopt; }

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

std::string listen_text(const Config& c) {
  const bool v6 = c.host.find(':') != std::string::npos;
  return (v6 ? "[" + c.host + "]" : c.host) + ":" + std::to_string(c.port);
}

// Settings that existed and went: a file, variable or flag naming one gets
// this instead of "unknown setting".
struct Removed {
  std::string_view key;
  std::string_view why;
};
constexpr Removed kRemoved[] = {
    {"http.workers",
     "removed: connections no longer take a thread each (see http.io_threads, "
     "http.max_connections)"},
    {"http.queue", "removed: connections no longer wait for a thread (see http.max_connections)"},
    {"http.read_timeout_ms",
     "removed: replaced by http.head_timeout_ms and http.body_timeout_ms (deadlines for the "
     "whole head and body)"},
    {"compute.help",
     "removed: no handler waits for its factorial any more, so none can run the queue while "
     "it waits (docs/crewd.md, \"Figures\")"},
};

const Removed* removed_setting(std::string_view key) {
  for (const Removed& r : kRemoved) {
    if (r.key == key) return &r;
  }
  return nullptr;
}

const std::vector<Setting>& settings() {
  using crew::LogLevel;
  using crew::ShutdownMode;
  constexpr std::uint64_t kDay = 24ull * 3600 * 1000;
  static const std::vector<Setting> all = [] {
    std::vector<Setting> s;
    s.push_back(Setting{"listen", "address to listen on, HOST:PORT (port 0: any free port)",
                        set_listen,
                        [](Config& c, const toml::node& node) -> std::optional<std::string> {
                          const auto v = node.value_exact<std::string>();
                          if (!v) return "must be a string HOST:PORT";
                          return set_listen(c, *v);
                        },
                        [](const Config& c) { return toml_string(listen_text(c)); }});
    s.push_back(choice<LogLevel>("log_level", "least severe log level written",
                                 +[](Config& c) -> LogLevel& { return c.log_level; },
                                 {{"debug", LogLevel::debug},
                                  {"info", LogLevel::info},
                                  {"warning", LogLevel::warning},
                                  {"error", LogLevel::error}}));

    s.push_back(integer(
        "http.io_threads", "I/O threads serving every connection (0: one per hardware thread)",
        +[](Config& c) -> std::size_t& { return c.http.io_threads; }, 0, 256));
    s.push_back(integer(
        "http.max_connections",
        "open connections at most; then the oldest idle one is closed, or the new one gets 503",
        +[](Config& c) -> std::size_t& { return c.http.max_connections; }, 1, 1'000'000));
    s.push_back(integer(
        "http.backlog", "listen(2) backlog of the listening socket",
        +[](Config& c) -> std::size_t& { return c.http.backlog; }, 1, 65'535));
    s.push_back(integer(
        "http.header_limit", "largest request line + header fields in bytes (larger: 431, 414)",
        +[](Config& c) -> std::size_t& { return c.http.header_limit; }, 256, 1u << 20));
    s.push_back(integer(
        "http.header_count_limit", "most header fields in a request (more: 431)",
        +[](Config& c) -> std::size_t& { return c.http.header_count_limit; }, 1, 10'000));
    s.push_back(integer(
        "http.body_limit", "largest request body in bytes (larger: 413)",
        +[](Config& c) -> std::size_t& { return c.http.body_limit; }, 1, 64ull << 20));
    s.push_back(integer(
        "http.head_timeout_ms",
        "from a request's first byte to its complete head (later: 408, connection closed)",
        +[](Config& c) -> Millis& { return c.http.head_timeout; }, 1, kDay));
    s.push_back(integer(
        "http.body_timeout_ms",
        "from a request's head to its complete body (later: 408, connection closed)",
        +[](Config& c) -> Millis& { return c.http.body_timeout; }, 1, kDay));
    s.push_back(integer(
        "http.keep_alive_timeout_s",
        "connections without a request in progress are closed after this many seconds",
        +[](Config& c) -> std::chrono::seconds& { return c.http.keep_alive_timeout; }, 1, 3600));
    s.push_back(integer(
        "http.keep_alive_max", "requests served on one connection",
        +[](Config& c) -> std::size_t& { return c.http.keep_alive_max; }, 1, 1'000'000));
    s.push_back(integer(
        "http.write_timeout_ms", "bound of writing one response (later: connection closed)",
        +[](Config& c) -> Millis& { return c.http.write_timeout; }, 1, kDay));

    s.push_back(integer(
        "compute.workers", "workers of pool compute (0: one per hardware thread)",
        +[](Config& c) -> std::size_t& { return c.compute.workers; }, 0, 10'000));
    s.push_back(integer(
        "compute.queue", "queued factorial tasks at most (more: 503)",
        +[](Config& c) -> std::size_t& { return c.compute.queue; }, 1, 10'000'000));
    s.push_back(integer(
        "compute.queue_timeout_ms", "a factorial task not started by then: 503",
        +[](Config& c) -> Millis& { return c.compute.queue_timeout; }, 1, kDay));
    s.push_back(boolean(
        "compute.inline_factorial",
        "compute factorials on the connection's I/O thread, not the pool (to measure the pool)",
        +[](Config& c) -> bool& { return c.compute.inline_factorial; }));

    s.push_back(integer(
        "jobs.workers", "workers of pool jobs: jobs running at once",
        +[](Config& c) -> std::size_t& { return c.jobs.workers; }, 1, 10'000));
    s.push_back(integer(
        "jobs.queue", "queued jobs at most (more: 503)",
        +[](Config& c) -> std::size_t& { return c.jobs.queue; }, 1, 1'000'000));
    s.push_back(integer(
        "jobs.queue_timeout_ms", "a job not started by then: 503",
        +[](Config& c) -> Millis& { return c.jobs.queue_timeout; }, 1, kDay));
    s.push_back(integer(
        "jobs.max_ms", "largest \"ms\" of a job",
        +[](Config& c) -> std::uint32_t& { return c.jobs.limits.max_ms; }, 0, kDay));
    s.push_back(integer(
        "jobs.max_timeout_ms", "largest \"timeout_ms\" of a job",
        +[](Config& c) -> std::uint32_t& { return c.jobs.limits.max_timeout_ms; }, 1, kDay));
    s.push_back(integer(
        "jobs.default_timeout_ms", "\"timeout_ms\" of a job that gives none",
        +[](Config& c) -> std::uint32_t& { return c.jobs.limits.default_timeout_ms; }, 1, kDay));

    s.push_back(choice<ShutdownMode>("shutdown.mode",
                                     "how the compute and jobs pools stop after SIGTERM",
                                     +[](Config& c) -> ShutdownMode& { return c.shutdown.mode; },
                                     {{"drain", ShutdownMode::drain},
                                      {"soft", ShutdownMode::soft},
                                      {"hard", ShutdownMode::hard}}));
    s.push_back(integer(
        "shutdown.timeout_ms", "bound of the pools' shutdown; then they escalate to hard",
        +[](Config& c) -> Millis& { return c.shutdown.timeout; }, 1, kDay));
    s.push_back(integer(
        "shutdown.termination_timeout_ms",
        "from SIGTERM to giving up on the graceful stop (exit 4)",
        +[](Config& c) -> Millis& { return c.shutdown.termination_timeout; }, 1, kDay));
    s.push_back(integer(
        "shutdown.admit_grace_ms",
        "requests reaching crewd this soon after SIGTERM are still served",
        +[](Config& c) -> Millis& { return c.shutdown.admit_grace; }, 0, 60'000));

    s.push_back(text(
        "redis.address", "Redis HOST:PORT to take jobs from (empty: no Redis)",
        +[](Config& c) -> std::string& { return c.redis.address; }, check_redis_address));
    s.push_back(text(
        "redis.password", "Redis AUTH password (empty: none)",
        +[](Config& c) -> std::string& { return c.redis.password; }, check_anything,
        /*secret=*/true));
    s.push_back(text(
        "redis.stream", "the stream jobs are taken from",
        +[](Config& c) -> std::string& { return c.redis.stream; }, check_redis_name));
    s.push_back(text(
        "redis.group", "the consumer group the instances share",
        +[](Config& c) -> std::string& { return c.redis.group; }, check_redis_name));
    s.push_back(text(
        "redis.consumer", "this instance's name in the group (empty: <host name>-<pid>)",
        +[](Config& c) -> std::string& { return c.redis.consumer; }, check_consumer));
    s.push_back(text(
        "redis.results_stream", "the stream outcomes are written to",
        +[](Config& c) -> std::string& { return c.redis.results_stream; }, check_redis_name));
    s.push_back(text(
        "redis.dead_letter_stream", "the stream jobs go to after their last failed attempt",
        +[](Config& c) -> std::string& { return c.redis.dead_letter_stream; }, check_redis_name));
    s.push_back(integer(
        "redis.claim_idle_ms", "entries pending this long are claimed from their consumer",
        +[](Config& c) -> Millis& { return c.redis.claim_idle; }, 100, kDay));
    s.push_back(integer(
        "redis.max_attempts", "attempts of a failing job before it is dead-lettered",
        +[](Config& c) -> std::uint32_t& { return c.redis.max_attempts; }, 1, 100));
    s.push_back(integer(
        "redis.retry_backoff_ms", "delay before a retry; doubles for each further one",
        +[](Config& c) -> Millis& { return c.redis.retry_backoff; }, 0, kDay));
    s.push_back(integer(
        "redis.in_flight", "stream jobs taken and not yet finished at most (0: jobs.workers)",
        +[](Config& c) -> std::size_t& { return c.redis.in_flight; }, 0, 1'000'000));
    s.push_back(integer(
        "redis.batch", "entries taken per XREADGROUP at most (COUNT)",
        +[](Config& c) -> std::size_t& { return c.redis.batch; }, 1, 10'000));
    return s;
  }();
  return all;
}

// Client-controlled text in an error message: printable, short.
std::string shown_value(std::string_view text) {
  std::string out;
  for (const char ch : text.substr(0, 64)) {
    out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  }
  if (text.size() > 64) out += "...";
  return "\"" + out + "\"";
}

std::string error_line(const std::string& key, const std::string& value, const std::string& from,
                       const std::string& must) {
  return "crewd: configuration error: " + key + " = " + value + " (" + from + "): " + must + "\n";
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

std::string source_name(Source s, const std::string& file) {
  switch (s) {
    case Source::defaults:
      return "default";
    case Source::file:
      return "file " + file;
    case Source::env:
      return "env";
    case Source::flag:
      return "flag";
  }
  return "?";
}

// A TOML value as it was written (strings quoted), short and printable.
std::string shown_node(const toml::node& node) {
  if (node.is_table()) return "(a table)";
  if (node.is_array()) return "(an array)";
  if (const auto str = node.value_exact<std::string>()) return shown_value(*str);
  std::ostringstream os;
  node.visit([&os](const auto& v) { os << v; });
  const std::string quoted = shown_value(os.str());
  return quoted.substr(1, quoted.size() - 2);  // not a string: no quotes
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// " (did you mean X?)" for the closest of `names`, if it is close.
std::string suggestion(std::string_view name, const std::vector<std::string>& names) {
  std::size_t best = 4;
  std::string found;
  for (const auto& n : names) {
    const std::size_t d = edit_distance(name, n);
    if (d < best) {
      best = d;
      found = n;
    }
  }
  return found.empty() ? "" : " (did you mean " + found + "?)";
}

// Kubernetes' service links for a Service named crewd: CREWD_SERVICE_HOST,
// CREWD_SERVICE_PORT[_NAME], CREWD_PORT, CREWD_PORT_<port>_<proto>[_PROTO|_PORT|_ADDR].
bool kubernetes_service_link(std::string_view name) {
  name.remove_prefix(std::string_view("CREWD_").size());
  if (name == "SERVICE_HOST" || name == "SERVICE_PORT" || name.starts_with("SERVICE_PORT_") ||
      name == "PORT") {
    return true;
  }
  if (!name.starts_with("PORT_")) return false;
  name.remove_prefix(5);
  const auto digits = name.find_first_not_of("0123456789");
  if (digits == 0 || digits == std::string_view::npos) return false;
  name.remove_prefix(digits);
  for (const std::string_view proto : {"_TCP", "_UDP", "_SCTP"}) {
    if (name.starts_with(proto)) {
      const std::string_view rest = name.substr(proto.size());
      return rest.empty() || rest == "_PROTO" || rest == "_PORT" || rest == "_ADDR";
    }
  }
  return false;
}

// Resolves the listen host as the server will (passive, TCP): an empty
// string, or the resolver's reason.
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

std::string toml_of(const Config& config, const std::vector<std::string>& sources) {
  std::string out = "# crewd configuration: defaults < TOML file < CREWD_* environment < flags\n";
  std::string section;
  const auto& all = settings();
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Setting& s = all[i];
    const auto dot = s.key.find('.');
    const std::string sec = dot == std::string::npos ? "" : s.key.substr(0, dot);
    const std::string name = dot == std::string::npos ? s.key : s.key.substr(dot + 1);
    if (sec != section) {
      out += "\n[" + sec + "]\n";
      section = sec;
    }
    std::string line = name + " = " + s.show(config);
    line.resize(std::max<std::size_t>(line.size(), 36), ' ');
    out += line + "  # " + s.help;
    if (i < sources.size() && !sources[i].empty()) out += " [" + sources[i] + "]";
    out += "\n";
  }
  return out;
}

}  // namespace

Environment process_environment() {
  // Read once, at start-up, before crewd starts any thread.
  Environment env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (!entry.starts_with("CREWD_")) continue;
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

std::string env_name(std::string_view key) {
  std::string out = "CREWD_";
  for (const char c : key) {
    out += c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return out;
}

std::string flag_name(std::string_view key) {
  std::string out = "--";
  for (const char c : key) out += (c == '.' || c == '_') ? '-' : c;
  return out;
}

std::string to_toml(const Config& config, const std::vector<std::string>& sources) {
  return toml_of(config, sources);
}

LoadResult load_config(const std::vector<std::string>& args, const Environment& env) {
  LoadResult result;
  const auto& all = settings();
  std::vector<std::string> sources(all.size(), source_name(Source::defaults, ""));

  CLI::App cli("crewd: an HTTP service on crew pools (docs/crewd.md)", "crewd");
  cli.footer(
      "Each setting is also read from a TOML file (--config, or CREWD_CONFIG; keys as in\n"
      "--print-config) and from the environment variable CREWD_<KEY> ('.' -> '_', upper\n"
      "case); flags override the environment, which overrides the file.\n"
      "Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 start-up failure, 4 termination\n"
      "timeout, 5 forced by a second signal, 6 shutdown failure, 78 configuration error.");
  std::string config_file;
  bool print_config = false;
  cli.add_option("--config", config_file, "TOML file to read settings from (env CREWD_CONFIG)");
  cli.add_flag("--print-config", print_config,
               "print the effective configuration as TOML and exit");
  std::vector<std::string> flag_values(all.size());
  std::vector<CLI::Option*> flags(all.size());
  const Config defaults;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Setting& s = all[i];
    flags[i] =
        cli.add_option(flag_name(s.key), flag_values[i],
                       s.help + " (default " + s.show(defaults) + ", env " + env_name(s.key) + ")");
    flags[i]->type_name("VALUE");
  }
  // Removed settings: not in --help, but named in the error if given.
  std::vector<std::string> removed_values(std::size(kRemoved));
  std::vector<CLI::Option*> removed_flags;
  for (std::size_t i = 0; i < std::size(kRemoved); ++i) {
    removed_flags.push_back(
        cli.add_option(flag_name(kRemoved[i].key), removed_values[i])->group(""));
  }

  std::vector<const char*> argv;
  argv.reserve(args.size() + 1);
  argv.push_back("crewd");
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    cli.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::CallForHelp&) {
    result.out = cli.help();
    result.exit_code = 0;
    return result;
  } catch (const CLI::ParseError& e) {
    result.err = std::string("crewd: ") + e.what() + "\nRun with --help for more information.\n";
    result.exit_code = kUsageExit;
    return result;
  }

  Config config;
  const auto fail = [&](std::string message) {
    result.err = std::move(message);
    result.exit_code = kConfigErrorExit;
    return result;
  };

  // 1. The file.
  if (config_file.empty()) {
    if (const auto it = env.find("CREWD_CONFIG"); it != env.end()) config_file = it->second;
  }
  if (!config_file.empty()) {
    toml::table doc;
    try {
      doc = toml::parse_file(config_file);
    } catch (const toml::parse_error& e) {
      std::ostringstream where;
      where << e.source().begin;
      return fail("crewd: configuration error: cannot read " + config_file + " (" + where.str() +
                  "): " + std::string(e.description()) + "\n");
    }
    // Every key must be a known setting: a typo must not pass silently.
    std::string problem;
    const auto visit = [&](const std::string& key, const toml::node& node) {
      const auto it =
          std::find_if(all.begin(), all.end(), [&](const Setting& s) { return s.key == key; });
      const std::string line = std::to_string(node.source().begin.line);
      if (it == all.end()) {
        if (const Removed* r = removed_setting(key)) {
          problem = "crewd: configuration error: " + key + " in " + config_file + " (line " + line +
                    "): " + std::string(r->why) + "\n";
          return;
        }
        std::vector<std::string> keys;
        for (const Setting& st : all) keys.push_back(st.key);
        problem = "crewd: configuration error: unknown setting " + key + " in " + config_file +
                  " (line " + line + ")" + suggestion(key, keys) + "\n";
        return;
      }
      if (auto err = it->from_toml(config, node)) {
        problem =
            error_line(key, shown_node(node), "from file " + config_file + ", line " + line, *err);
        return;
      }
      sources[static_cast<std::size_t>(it - all.begin())] = source_name(Source::file, config_file);
    };
    for (const auto& [k, node] : doc) {
      const std::string key(k.str());
      if (const auto* section = node.as_table()) {
        for (const auto& [sub, value] : *section) {
          if (problem.empty()) visit(key + "." + std::string(sub.str()), value);
        }
      } else if (problem.empty()) {
        visit(key, node);
      }
    }
    if (!problem.empty()) return fail(problem);
    result.config_file = config_file;
  }

  // 2. The environment: every CREWD_* variable must name a setting.
  std::vector<std::string> env_names{"CREWD_CONFIG"};
  for (const Setting& st : all) env_names.push_back(env_name(st.key));
  for (const auto& [name, value] : env) {
    if (!name.starts_with("CREWD_") ||
        std::find(env_names.begin(), env_names.end(), name) != env_names.end() ||
        kubernetes_service_link(name)) {
      continue;
    }
    for (const Removed& r : kRemoved) {
      if (env_name(r.key) == name) {
        return fail("crewd: configuration error: " + name + "=" + shown_value(value) +
                    " (env): " + std::string(r.key) + " " + std::string(r.why) + "\n");
      }
    }
    return fail("crewd: configuration error: unknown environment variable " + name + "=" +
                shown_value(value) + ": no such setting" + suggestion(name, env_names) +
                " (crewd --help lists them)\n");
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Setting& s = all[i];
    const std::string name = env_name(s.key);
    if (const auto it = env.find(name); it != env.end()) {
      if (auto err = s.from_text(config, it->second)) {
        return fail(error_line(s.key, shown_value(it->second), "from env " + name, *err));
      }
      sources[i] = source_name(Source::env, "");
    }
  }
  // 3. The flags.
  for (std::size_t i = 0; i < removed_flags.size(); ++i) {
    if (removed_flags[i]->count() == 0) continue;
    return fail("crewd: configuration error: " + std::string(kRemoved[i].key) + " = " +
                shown_value(removed_values[i]) + " (from flag " + flag_name(kRemoved[i].key) +
                "): " + std::string(kRemoved[i].why) + "\n");
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Setting& s = all[i];
    if (flags[i]->count() == 0) continue;
    if (auto err = s.from_text(config, flag_values[i])) {
      return fail(
          error_line(s.key, shown_value(flag_values[i]), "from flag " + flag_name(s.key), *err));
    }
    sources[i] = source_name(Source::flag, "");
  }

  if (auto err = cross_check(config)) return fail("crewd: configuration error: " + *err + "\n");
  if (const std::string why = resolve_error(config.host); !why.empty()) {
    const auto listen = static_cast<std::size_t>(
        std::find_if(all.begin(), all.end(), [](const Setting& st) { return st.key == "listen"; }) -
        all.begin());
    const std::string& src = sources[listen];
    const std::string from = src == "flag"      ? "from flag --listen"
                             : src == "env"     ? "from env CREWD_LISTEN"
                             : src == "default" ? "default"
                                                : "from " + src;
    return fail(error_line("listen", shown_value(listen_text(config)), from,
                           "cannot resolve host " + shown_value(config.host) + ": " + why));
  }

  result.config = config;
  if (print_config) {
    result.out = toml_of(config, sources);
    result.exit_code = 0;
    return result;
  }
  result.run = true;
  return result;
}

}  // namespace crewd
