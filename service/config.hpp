// service/config.hpp: crewd's settings and how they are layered.
//
// Every setting has a working default. Values are taken, each overriding the
// one before, from
//   1. a TOML file (--config FILE, or CREWD_CONFIG),
//   2. environment variables CREWD_<KEY> (key upper-cased, '.' -> '_'),
//   3. command-line flags --<key> ('.' and '_' -> '-').
// e.g. shutdown.timeout_ms = 10000 in [shutdown] of the file,
// CREWD_SHUTDOWN_TIMEOUT_MS=10000, --shutdown-timeout-ms 10000.
// docs/crewd.md lists every setting.
//
// A bad value (wrong type, out of range, an unknown key in the file, an
// inconsistent pair) stops start-up with a message naming the setting and
// where the value came from; crewd then exits with kConfigErrorExit.
#pragma once

#include <chrono>
#include <crew/log.hpp>
#include <crew/pool_types.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jobs.hpp"

namespace crewd {

// Exit codes of crewd beyond crew::ExitCode (0, 1, 3-6).
inline constexpr int kUsageExit = 2;         // unknown flag, missing flag value
inline constexpr int kConfigErrorExit = 78;  // a bad setting (sysexits.h EX_CONFIG)

using Millis = std::chrono::milliseconds;

struct Config {
  // listen = "HOST:PORT"; port 0 picks a free port (logged at start-up).
  std::string host = "127.0.0.1";
  std::uint16_t port = 8080;
  crew::LogLevel log_level = crew::LogLevel::info;

  // Connections: each one is served by a worker of the "http" pool for its
  // whole life (cpp-httplib does blocking I/O), so workers bound the
  // connections served at once; the rest wait in the pool's queue.
  struct Http {
    std::size_t workers = 256;
    std::size_t queue = 4096;
    std::size_t backlog = 1024;          // listen(2) backlog
    std::size_t body_limit = 64 * 1024;  // bytes; larger bodies get 413
    std::chrono::seconds keep_alive_timeout{5};
    std::size_t keep_alive_max = 1000;  // requests per connection
    Millis read_timeout{5000};
    Millis write_timeout{5000};
  } http;

  // GET /api/v1/factorial/{n}: short tasks.
  struct Compute {
    std::size_t workers = 0;  // 0: one per hardware thread
    std::size_t queue = 10'000;
    Millis queue_timeout{1000};  // a task not started by then: 503
    // A handler waiting for its factorial runs queued compute tasks itself
    // (at most `workers` handlers at once) instead of sleeping until a
    // compute worker has run it (docs/crewd.md, "Figures").
    bool help = true;
    // Compute on the connection's thread instead of the pool: only for
    // measuring what the pool costs (README, "crewd figures").
    bool inline_factorial = false;
  } compute;

  // POST /api/v1/jobs: long tasks with a deadline.
  struct Jobs {
    std::size_t workers = 64;
    std::size_t queue = 1024;
    Millis queue_timeout{5000};
    JobLimits limits;
  } jobs;

  struct Shutdown {
    // How the compute and jobs pools stop after a SIGTERM: drain runs every
    // accepted task, soft rejects queued ones (503), hard also cancels running
    // jobs. See docs/crewd.md, "Lifecycle".
    crew::ShutdownMode mode = crew::ShutdownMode::drain;
    // Bound of that pool shutdown; past it the pool escalates to hard.
    Millis timeout{10'000};
    // From SIGTERM until crewd gives up on the graceful path (exit 4).
    Millis termination_timeout{20'000};
    // After SIGTERM, requests that reach crewd within this window are still
    // served: they were sent before the signal and sat in kernel queues.
    Millis admit_grace{100};
  } shutdown;

  // Jobs from a Redis stream (service/redis_jobs.hpp, docs/distributed.md);
  // off while address is empty.
  struct Redis {
    std::string address;   // HOST:PORT
    std::string password;  // AUTH when set; --print-config hides it
    std::string stream = "crew:jobs";
    std::string group = "crew";
    std::string consumer;  // this instance in the group; empty: "<host name>-<pid>"
    std::string results_stream = "crew:results";
    std::string dead_letter_stream = "crew:dead";
    Millis claim_idle{30'000};  // entries pending this long are claimed from their consumer
    std::uint32_t max_attempts = 3;
    Millis retry_backoff{100};  // before the second attempt; doubles for each further one
    std::size_t in_flight = 0;  // jobs taken and not yet finished; 0: jobs.workers
    std::size_t batch = 64;     // entries per XREADGROUP at most (COUNT)
  } redis;
};

// Where the environment comes from (tests pass a map).
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
[[nodiscard]] EnvLookup process_environment();

// What start-up should do after reading the command line.
struct LoadResult {
  Config config;
  bool run = false;         // start the service with `config`
  int exit_code = 0;        // otherwise exit with this code
  std::string out;          // for stdout (--help, --print-config)
  std::string err;          // for stderr (the error message)
  std::string config_file;  // the file read, if any
};

// Parses the command line, reads the file and the environment, validates.
// Never throws for bad input: errors come back as exit_code + err.
[[nodiscard]] LoadResult load_config(const std::vector<std::string>& args, const EnvLookup& env);

// The effective configuration as a TOML file (what --print-config writes),
// each line commented with where its value came from.
[[nodiscard]] std::string to_toml(const Config& config,
                                  const std::vector<std::string>& sources = {});

// The names a setting goes by.
[[nodiscard]] std::string env_name(std::string_view key);
[[nodiscard]] std::string flag_name(std::string_view key);

}  // namespace crewd
