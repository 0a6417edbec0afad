// The table of crewd's settings (service/config/settings.hpp) and the effective
// configuration as TOML (to_toml, config.hpp).
#include "config/settings.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "config/config_validate.hpp"

namespace crewd {
namespace {

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
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

// The overload settings of the pool `Pool` (Config::compute or
// Config::jobs), named "<pool>.overload*"; `what` names its requests.
template <auto Pool>
void push_overload_settings(std::vector<Setting>& s, const std::string& pool,
                            const std::string& what) {
  constexpr std::uint64_t kDay = 24ull * 3600 * 1000;  // ms
  s.push_back(boolean(
      pool + ".overload",
      "overload controller of pool " + pool + ": an adaptive limit on admitted " + what +
          " (more: 503 from the request's head) and CoDel's drop of " + what +
          " queued too long (503)",
      +[](Config& c) -> bool& { return (c.*Pool).overload.enabled; }));
  s.push_back(integer(
      pool + ".overload_target_ms", "queue wait the overload controller of pool " + pool + " keeps",
      +[](Config& c) -> Millis& { return (c.*Pool).overload.target; }, 1, kDay));
  s.push_back(integer(
      pool + ".overload_interval_ms",
      "how often the limit of pool " + pool +
          " moves, and how long a queue wait over the target lasts before " + what + " are shed",
      +[](Config& c) -> Millis& { return (c.*Pool).overload.interval; }, 1, kDay));
  s.push_back(boolean(
      pool + ".overload_adaptive_limit",
      "the adaptive limit of pool " + pool + " (false: CoDel's drop alone)",
      +[](Config& c) -> bool& { return (c.*Pool).overload.adaptive_limit; }));
  using Signal = Config::Overload::RunTimeSignal;
  s.push_back(choice<Signal>(
      pool + ".overload_run_time_signal",
      "the limit of pool " + pool +
          " also follows the run time of its tasks, for more workers than CPUs (auto: on when "
          "the pool has more workers than usable CPUs; needs " +
          pool + ".overload_adaptive_limit)",
      +[](Config& c) -> Signal& { return (c.*Pool).overload.run_time_signal; },
      {{"auto", Signal::automatic}, {"true", Signal::on}, {"false", Signal::off}}));
}

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

}  // namespace

std::span<const Removed> removed_settings() { return kRemoved; }

const Removed* removed_setting(std::string_view key) {
  for (const Removed& r : kRemoved) {
    if (r.key == key) return &r;
  }
  return nullptr;
}

std::string listen_text(const Config& c) {
  const bool v6 = c.host.find(':') != std::string::npos;
  return (v6 ? "[" + c.host + "]" : c.host) + ":" + std::to_string(c.port);
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
        "http.io_threads", "I/O threads serving every connection (0: one per usable CPU)",
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
        "http.io_slice_us",
        "time slice each I/O thread asks of Linux's EEVDF scheduler (Linux 6.12+; 0: the "
        "system's default); shorter than a busy worker's lets a woken I/O thread preempt it",
        +[](Config& c) -> std::chrono::microseconds& { return c.http.io_slice; }, 0, 100'000));
    using IoPolicy = Config::Http::IoPolicy;
    s.push_back(choice<IoPolicy>(
        "http.io_policy",
        "scheduling of the I/O threads: normal, or fifo (SCHED_FIFO priority 1: a woken I/O "
        "thread preempts any busy worker at once; needs CAP_SYS_NICE or RLIMIT_RTPRIO)",
        +[](Config& c) -> IoPolicy& { return c.http.io_policy; },
        {{"normal", IoPolicy::normal}, {"fifo", IoPolicy::fifo}}));

    s.push_back(integer(
        "compute.workers", "workers of pool compute (0: one per usable CPU)",
        +[](Config& c) -> std::size_t& { return c.compute.workers; }, 0, 10'000));
    s.push_back(integer(
        "compute.queue", "queued factorial tasks at most (more: 503)",
        +[](Config& c) -> std::size_t& { return c.compute.queue; }, 1, 10'000'000));
    s.push_back(integer(
        "compute.queue_timeout_ms", "a factorial task not started by then: 503",
        +[](Config& c) -> Millis& { return c.compute.queue_timeout; }, 1, kDay));
    s.push_back(choice<crew::WorkerPolicy>(
        "compute.worker_policy",
        "scheduling of compute workers: batch (a woken worker does not preempt the I/O thread "
        "that handed it work) or normal",
        +[](Config& c) -> crew::WorkerPolicy& { return c.compute.worker_policy; },
        {{"batch", crew::WorkerPolicy::batch}, {"normal", crew::WorkerPolicy::normal}}));
    s.push_back(integer(
        "compute.spin_us",
        "microseconds an idle compute worker polls for the next task before it sleeps",
        +[](Config& c) -> std::chrono::microseconds& { return c.compute.spin; }, 0, 1'000'000));
    s.push_back(boolean(
        "compute.spin_when_contended",
        "spin for the whole compute.spin_us also while the machine's CPUs are contended (threads "
        "waiting for a CPU most of the time; otherwise at most 5 us): for compute workers on CPUs "
        "of their own",
        +[](Config& c) -> bool& { return c.compute.spin_when_contended; }));
    s.push_back(boolean(
        "compute.inline_factorial",
        "compute factorials on the connection's I/O thread, not the pool (to measure the pool)",
        +[](Config& c) -> bool& { return c.compute.inline_factorial; }));
    push_overload_settings<&Config::compute>(s, "compute", "factorials");

    s.push_back(integer(
        "jobs.workers",
        "threads of pool jobs (spin and stuck jobs hold one while they run; sleep and call jobs "
        "hold none while they wait)",
        +[](Config& c) -> std::size_t& { return c.jobs.workers; }, 1, 10'000));
    s.push_back(integer(
        "jobs.max_in_flight",
        "jobs in progress (queued, running or waiting) at most; more: 503 with Retry-After",
        +[](Config& c) -> std::size_t& { return c.jobs.max_in_flight; }, 1, 1'000'000));
    s.push_back(text(
        "jobs.call_url", "what a \"call\" job GETs: http://HOST[:PORT]/PATH (empty: no call jobs)",
        +[](Config& c) -> std::string& { return c.jobs.call_url; }, check_call_url));
    s.push_back(integer(
        "jobs.call_timeout_ms", "a call job's downstream not answered by then: 504",
        +[](Config& c) -> Millis& { return c.jobs.call_timeout; }, 1, kDay));
    s.push_back(integer(
        "jobs.queue", "queued jobs at most (more: 503)",
        +[](Config& c) -> std::size_t& { return c.jobs.queue; }, 1, 1'000'000));
    s.push_back(integer(
        "jobs.queue_timeout_ms", "a job not started by then: 503",
        +[](Config& c) -> Millis& { return c.jobs.queue_timeout; }, 1, kDay));
    s.push_back(integer(
        "jobs.worker_nice",
        "nice steps each jobs worker runs below crewd's other threads (with "
        "jobs.worker_slice_us, its I/O threads answer first on a shared CPU; 0: the same "
        "priority)",
        +[](Config& c) -> unsigned& { return c.jobs.worker_nice; }, 0, 39));
    s.push_back(integer(
        "jobs.worker_slice_us",
        "time slice each jobs worker asks of Linux's EEVDF scheduler (Linux 6.12+; 0: the "
        "system's default); longer than the I/O threads', it lets a woken I/O thread preempt "
        "a computing job",
        +[](Config& c) -> std::chrono::microseconds& { return c.jobs.worker_slice; }, 0, 100'000));
    using Policy = Config::Jobs::WorkerPolicy;
    s.push_back(choice<Policy>(
        "jobs.worker_policy",
        "scheduling of jobs workers: normal, batch (SCHED_BATCH, as compute.worker_policy) or "
        "idle (SCHED_IDLE: crewd's I/O threads preempt a jobs worker when they wake)",
        +[](Config& c) -> Policy& { return c.jobs.worker_policy; },
        {{"normal", Policy::normal}, {"batch", Policy::batch}, {"idle", Policy::idle}}));
    s.push_back(integer(
        "jobs.max_ms", "largest \"ms\" of a job",
        +[](Config& c) -> std::uint32_t& { return c.jobs.limits.max_ms; }, 0, kDay));
    s.push_back(integer(
        "jobs.max_timeout_ms", "largest \"timeout_ms\" of a job",
        +[](Config& c) -> std::uint32_t& { return c.jobs.limits.max_timeout_ms; }, 1, kDay));
    s.push_back(integer(
        "jobs.default_timeout_ms", "\"timeout_ms\" of a job that gives none",
        +[](Config& c) -> std::uint32_t& { return c.jobs.limits.default_timeout_ms; }, 1, kDay));
    s.push_back(boolean(
        "jobs.allow_stuck",
        "accept jobs of kind \"stuck\", which ignore their stop token (for tests of deadlines and "
        "abandoned workers)",
        +[](Config& c) -> bool& { return c.jobs.limits.allow_stuck; }));
    push_overload_settings<&Config::jobs>(s, "jobs", "jobs");

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
    s.push_back(integer(
        "redis.priority",
        "the jobs pool's priority level of stream jobs: 0 (low) .. 2 (high), as X-Priority",
        +[](Config& c) -> std::uint32_t& { return c.redis.priority; }, 0, 2));
    s.push_back(integer(
        "redis.max_entry_bytes",
        "an entry with more bytes of fields is dead-lettered unrun (not copied, not retried)",
        +[](Config& c) -> std::size_t& { return c.redis.max_entry_bytes; }, 1, 512 << 20));
    s.push_back(integer(
        "redis.max_entry_fields", "an entry with more fields is dead-lettered unrun",
        +[](Config& c) -> std::size_t& { return c.redis.max_entry_fields; }, 1, 1'000'000));

    s.push_back(boolean(
        "ui.enabled", "serve the operations console (GET /ui) and its snapshot",
        +[](Config& c) -> bool& { return c.ui.enabled; }));
    s.push_back(text(
        "ui.admin_address",
        "a local address besides loopback on which the console answers (empty: loopback only)",
        +[](Config& c) -> std::string& { return c.ui.admin_address; }, check_ui_address));
    s.push_back(text(
        "ui.token", "bearer token the console's snapshot and actions need (empty: none)",
        +[](Config& c) -> std::string& { return c.ui.token; }, check_ui_token,
        /*secret=*/true));
    s.push_back(boolean(
        "ui.read_only", "the console shows no action and the server refuses them (403)",
        +[](Config& c) -> bool& { return c.ui.read_only; }));
    s.push_back(integer(
        "ui.snapshot_rows", "rows of each list (queued, running, recent) in a snapshot at most",
        +[](Config& c) -> std::size_t& { return c.ui.snapshot_rows; }, 1, 10'000));
    s.push_back(integer(
        "ui.snapshot_bytes", "bytes of a snapshot at most (rows are left out to fit)",
        +[](Config& c) -> std::size_t& { return c.ui.snapshot_bytes; }, 16 * 1024, 16u << 20));
    s.push_back(integer(
        "ui.history", "recent job outcomes the console keeps",
        +[](Config& c) -> std::size_t& { return c.ui.history; }, 1, 100'000));
    return s;
  }();
  return all;
}

std::string to_toml(const Config& config, const std::vector<std::string>& sources) {
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

}  // namespace crewd
