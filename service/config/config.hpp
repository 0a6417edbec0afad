// service/config/config.hpp: crewd's settings and how they are layered.
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
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jobs/jobs.hpp"

namespace crewd {

// Exit codes of crewd beyond crew::ExitCode (0, 1, 3-6).
inline constexpr int kUsageExit = 2;         // unknown flag, missing flag value
inline constexpr int kConfigErrorExit = 78;  // a bad setting (sysexits.h EX_CONFIG)

using Millis = std::chrono::milliseconds;

struct Config {
  // listen = "HOST:PORT" or "[IPv6]:PORT"; port 0 picks a free port (logged
  // at start-up). host is kept without brackets.
  std::string host = "127.0.0.1";
  std::uint16_t port = 8080;
  crew::LogLevel log_level = crew::LogLevel::info;

  // The HTTP front door (service/http/server.hpp): a few I/O threads serve every
  // connection; a connection costs no thread. Each limit answers a client
  // that oversteps it at once (docs/crewd.md, "Limits").
  struct Http {
    std::size_t io_threads = 0;  // 0: one per usable CPU (crew::usable_cpus())
    // Open connections at most. At the limit the oldest idle connection of
    // the I/O thread taking the new one is closed; with none idle, the new
    // connection gets 503 and is closed.
    std::size_t max_connections = 16'384;
    std::size_t backlog = 1024;            // listen(2) backlog
    std::size_t header_limit = 16 * 1024;  // request line + header fields, bytes (431, 414)
    std::size_t header_count_limit = 100;  // header fields (431)
    std::size_t body_limit = 64 * 1024;    // bytes; larger bodies get 413
    Millis head_timeout{10'000};           // from a request's first byte to its complete head (408)
    Millis body_timeout{10'000};           // from the head to the complete body (408)
    std::chrono::seconds keep_alive_timeout{5};  // idle between requests, or before the first
    std::size_t keep_alive_max = 1000;           // requests per connection
    Millis write_timeout{5000};                  // writing one response
    // The time slice each I/O thread asks of Linux's scheduler (EEVDF's
    // sched_attr::sched_runtime, Linux 6.12 and later; the kernel keeps it
    // within 100 us - 100 ms). A woken thread whose slice is shorter than
    // the running one's preempts it at once, so a refusal decided on the
    // I/O thread does not wait for a busy jobs worker's slice to end. 0
    // (the default): the system's. 100 made refusals next to a computing
    // job faster but cost the compute pool's path 5 % of its throughput
    // at saturation (docs/bench/overload.md). No privilege needed; an
    // older kernel ignores it.
    std::chrono::microseconds io_slice{0};
    // How the I/O threads are scheduled. normal (the default): SCHED_OTHER,
    // as every other thread of crewd. fifo: SCHED_FIFO at priority 1, set by
    // each I/O thread on itself as it starts, with SCHED_RESET_ON_FORK so
    // that a thread it starts (a pool worker) is not real-time. A woken I/O
    // thread then takes its CPU from any normal thread at once, which
    // EEVDF does not promise when more jobs workers than CPUs compute
    // (docs/bench/overload.md, "W3 with real-time I/O threads"). Needs
    // CAP_SYS_NICE or RLIMIT_RTPRIO >= 1; refused, the I/O threads stay
    // normal and crewd says so in its log. io_slice does not apply to fifo.
    enum class IoPolicy : std::uint8_t { normal, fifo };
    IoPolicy io_policy = IoPolicy::normal;
  } http;

  // A pool's overload controller (crew::PoolOptions::overload): an
  // adaptive limit on admitted requests, checked on the I/O thread from
  // the request's head, and CoDel's drop of requests queued too long.
  struct Overload {
    bool enabled = true;
    Millis target{5};  // the queue wait to keep
    Millis interval{
        100};  // how often the limit moves; how long a standing queue lasts before shedding
    bool adaptive_limit = true;  // false: CoDel's drop alone
    // The run-time signal (crew::OverloadOptions::run_time_signal): the
    // limit also follows the tasks' run time, for a pool with more workers
    // than CPUs, whose queue hides in the OS run queue. automatic: on when
    // the pool has more workers than usable CPUs. Needs adaptive_limit.
    enum class RunTimeSignal : std::uint8_t { automatic, on, off };
    RunTimeSignal run_time_signal = RunTimeSignal::off;  // opt-in: see docs/crewd.md
  };

  // GET /api/v1/factorial/{n}: short tasks.
  struct Compute {
    std::size_t workers = 0;  // 0: one per usable CPU (crew::usable_cpus())
    std::size_t queue = 10'000;
    Millis queue_timeout{1000};  // a task not started by then: 503
    // batch: a woken compute worker does not preempt the I/O thread that
    // handed it the task (crew::WorkerPolicy::batch, Linux SCHED_BATCH).
    crew::WorkerPolicy worker_policy = crew::WorkerPolicy::batch;
    // How long an idle compute worker polls for the next task before it
    // sleeps (crew::PoolOptions::spin).
    std::chrono::microseconds spin =
        std::chrono::duration_cast<std::chrono::microseconds>(crew::PoolOptions{}.spin);
    // Spin for the whole `spin` also while the machine's CPUs are contended
    // (crew::PoolOptions::spin_when_contended).
    bool spin_when_contended = crew::PoolOptions{}.spin_when_contended;
    // Compute on the connection's I/O thread instead of the pool: only for
    // measuring what the pool costs (README, "crewd figures").
    bool inline_factorial = false;
    Overload overload;
  } compute;

  // POST /api/v1/jobs: long tasks with a deadline. Sleep and call jobs are
  // coroutine tasks (they hold no thread while they wait); spin and stuck
  // jobs, and jobs from Redis, hold a worker while they run.
  struct Jobs {
    std::size_t workers = 64;  // threads of the pool, all started with it
    std::size_t queue = 1024;
    // Jobs of POST /api/v1/jobs in progress (queued, running, or waiting
    // suspended) at most; more: 503 with Retry-After, from the request's head.
    std::size_t max_in_flight = 10'000;
    // What a "call" job GETs (http://HOST[:PORT]/PATH); empty: no call jobs.
    std::string call_url;
    Millis call_timeout{5000};  // a call without an answer by then: 504
    Millis queue_timeout{5000};
    // Each jobs worker runs this many nice steps below crewd's own threads
    // (at most nice 19), and asks Linux's EEVDF scheduler for a time slice
    // of worker_slice (sched_attr::sched_runtime, Linux 6.12+; 0: the
    // system's, 1.4 ms on 2 CPUs, at most 2.8 ms with the default
    // tunables). Together they let an I/O thread that wakes on a CPU where
    // a jobs worker computes take the CPU at once: a woken thread with a
    // shorter slice than the running one's may preempt it before that
    // one's slice is used up, and it does when the lower weight leaves the
    // I/O thread owed CPU time. Jobs then have a smaller share of a CPU
    // contended by other threads of crewd's scheduling group (docs/crewd.md,
    // "Priority and deadline"; docs/bench/overload.md, "Jobs workers a
    // little below the I/O threads, with a longer slice").
    unsigned worker_nice = 3;
    std::chrono::microseconds worker_slice{3000};
    // How Linux schedules the jobs workers: normal (SCHED_OTHER, as crewd's
    // other threads), batch (crew::WorkerPolicy::batch, SCHED_BATCH) or idle
    // (SCHED_IDLE, set by each worker on itself as it starts: any other
    // thread of crewd that wakes preempts it at once). Needs no privilege.
    // normal by default (docs/bench/overload.md, "W1 again, and the jobs
    // workers' scheduling policy").
    enum class WorkerPolicy : std::uint8_t { normal, batch, idle };
    WorkerPolicy worker_policy = WorkerPolicy::normal;
    JobLimits limits;
    Overload overload;
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

  // Jobs from a Redis stream (service/jobs/redis_jobs.hpp, docs/distributed.md);
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
    // The jobs pool's level of stream jobs (X-Priority's 0 low .. 2 high).
    std::uint32_t priority = 0;
    // An entry over either is dead-lettered unrun (StreamSourceOptions).
    std::size_t max_entry_bytes = std::size_t{1} << 20;
    std::size_t max_entry_fields = 1024;
  } redis;

  // The operations console (GET /ui, service/ui/console.hpp, docs/crewd.md
  // "Console"): off unless enabled; then served only to connections made to
  // a loopback address or to admin_address.
  struct Ui {
    bool enabled = false;
    std::string admin_address;        // another local address that serves it (empty: loopback only)
    std::string token;                // a bearer token the snapshot and actions need (empty: none)
    bool read_only = false;           // no actions: the page shows none, the server answers 403
    std::size_t snapshot_rows = 100;  // rows of each list in a snapshot at most
    std::size_t snapshot_bytes = 48 * 1024;  // bytes of a snapshot at most
    std::size_t history = 500;               // recent outcomes kept
  } ui;
};

// The environment: every variable whose name starts with CREWD_ (tests pass
// a map). An unknown CREWD_* name is an error, like an unknown key in the
// file, except Kubernetes' service links of a Service named crewd
// (CREWD_SERVICE_HOST, CREWD_PORT_8080_TCP, ...), which are ignored.
using Environment = std::map<std::string, std::string>;
[[nodiscard]] Environment process_environment();

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
// The listen host is resolved here (getaddrinfo), so that a bad address is a
// configuration error with the resolver's reason.
[[nodiscard]] LoadResult load_config(const std::vector<std::string>& args, const Environment& env);

// The effective configuration as a TOML file (what --print-config writes),
// each line commented with where its value came from.
[[nodiscard]] std::string to_toml(const Config& config,
                                  const std::vector<std::string>& sources = {});

// The names a setting goes by.
[[nodiscard]] std::string env_name(std::string_view key);
[[nodiscard]] std::string flag_name(std::string_view key);

}  // namespace crewd
