// crew/stream_source.hpp: jobs from a Redis stream, run on a crew pool
// (target crew::redis, built when hiredis is found; docs/distributed.md).
//
// A StreamSource is one consumer of a Redis Streams consumer group. Its
// reader thread takes entries with XREADGROUP, never more than the pool has
// room for (max_in_flight minus the jobs in flight: a slow instance takes
// less), and runs each as a long task on the pool. When the handler returns,
// the worker writes the outcome to the results stream and XACKs the entry,
// in one round trip, in that order: an entry is acknowledged only after its
// outcome is written. A failed job is retried on this instance with
// exponential backoff up to max_attempts, then written with its error to the
// dead-letter stream and acknowledged. An entry over max_entry_bytes or
// max_entry_fields is dead-lettered at once, without running.
//
// Recovery: entries left pending by a consumer that died or stopped (idle
// longer than claim_idle) are claimed with XAUTOCLAIM by live consumers.
// A live consumer keeps the entries it holds (running, queued or waiting
// for a retry) from being claimed, however long their jobs run: every
// claim_idle / 4 its reader thread resets their idle time (XCLAIM JUSTID,
// which leaves the delivery count alone). Only a consumer whose reader is
// stalled for most of claim_idle can lose a running job to another.
// Delivery is therefore at least once: every result carries the entry's id
// and its attempt number (Redis' delivery count plus local retries), so a
// duplicate is visible to whoever reads the results.
//
// Stop: stop() ends reading at once (within `block`); jobs in flight finish
// or not per the pool's shutdown, and a job whose handler did not return
// normally before its stop token was stopped is not acknowledged: it stays
// pending for another consumer to claim. Nothing is acknowledged that did
// not complete.
//
// Overload: when the pool refuses a job (Admission::overloaded, full or
// too_many_blocked) or its overload controller sheds one unrun (reason
// codel or priority), the entry stays held here, unacknowledged and in this
// consumer's pending list, and the reader backs off: it takes no new entry
// and submits none again until the backoff has passed, then submits the
// entries it holds first. Each backoff is the pool's queue-wait estimate
// (Pool::overload_hint) or the previous backoff doubled from
// overload_backoff_min, whichever is longer, at most overload_backoff_max,
// less up to a quarter of it at random (so that instances refused together
// do not come back together). A refusal during a backoff does not lengthen
// it; an accepted submission ends the doubling. A job refused because the
// pool is stopping is left pending as on stop().
//
// Connection loss is survived: both connections reconnect with exponential
// backoff; connected() is false meanwhile and stats().reconnects counts the
// reconnections.
//
// Thread safety: all member functions are thread-safe. The handler runs on
// the pool's workers, concurrently. Destroying a StreamSource stops it and
// waits for its jobs in flight; the pool must outlive it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "crew/log.hpp"

namespace crew {

class Pool;

struct StreamSourceOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string password{};  // AUTH when not empty
  std::string stream = "crew:jobs";
  std::string group = "crew";
  // This consumer's name in the group; empty: "<host name>-<pid>".
  std::string consumer{};
  std::string results_stream = "crew:results";
  std::string dead_letter_stream = "crew:dead";
  // Jobs read but not finished at most; 0: the pool's max_workers.
  std::size_t max_in_flight = 0;
  // Entries taken per XREADGROUP / XAUTOCLAIM at most (COUNT).
  std::size_t max_batch = 64;
  // How long one XREADGROUP waits for new entries: also how soon stop() and
  // a claim round take effect.
  std::chrono::milliseconds block{100};
  // Pending entries idle this long are claimed from other consumers.
  std::chrono::milliseconds claim_idle{30'000};
  // Attempts per job before it goes to the dead-letter stream (>= 1).
  std::uint32_t max_attempts = 3;
  // Delay before the second attempt; doubles for each further one.
  std::chrono::milliseconds retry_backoff{100};
  // Reconnection delays: from min, doubling, up to max.
  std::chrono::milliseconds reconnect_min{100};
  std::chrono::milliseconds reconnect_max{5'000};
  // Socket timeout of each command (the blocking read adds `block`).
  std::chrono::milliseconds command_timeout{2'000};
  // Execution deadline of each job (TaskOptions::timeout); 0: the pool's.
  std::chrono::milliseconds job_timeout{0};
  // The pool's priority level of every job (TaskOptions::priority; below
  // PoolOptions::priority_levels). The lowest by default: a stream entry
  // waits in Redis at no cost and is submitted again when refused, while a
  // caller waiting on the same pool (an HTTP request) cannot.
  std::uint8_t priority = 0;
  // The backoff after the pool refused or shed a job (see the top): from
  // min, doubling, up to max; both > 0.
  std::chrono::milliseconds overload_backoff_min{10};
  std::chrono::milliseconds overload_backoff_max{1'000};
  // An entry larger than this (its field names and values, in bytes) or
  // with more fields is not run: it goes to the dead-letter stream at once
  // (its attempt as delivered: 1, or Redis' delivery count for a claimed
  // entry; its fields not copied there; the error saying which limit it
  // passed) and is acknowledged, so it is neither copied nor retried.
  // Both >= 1. hiredis 0.14 (Debian 12) has no limit on a reply it reads,
  // so the entry is in memory once as hiredis' reply; these bound every
  // copy after it (the Job, the handler's work, the outcome's command).
  std::size_t max_entry_bytes = std::size_t{1} << 20;
  std::size_t max_entry_fields = 1024;
  // Written into every result.
  std::string instance_id{};         // empty: the consumer name
  std::shared_ptr<Logger> logger{};  // empty: crew::default_logger()
};

// One entry of the stream, as the handler sees it.
struct Job {
  std::string id;  // the stream entry id, e.g. "1700000000000-0"
  std::vector<std::pair<std::string, std::string>> fields;
  std::uint32_t attempt = 1;  // 1 for the first delivery

  // The value of a field, or `fallback`.
  [[nodiscard]] std::string field(std::string_view name, std::string_view fallback = {}) const;
};

// What a handler returns for a job that ran to its end. Throwing counts as a
// failure with the exception's message.
struct JobResult {
  bool ok = true;
  std::string value{};  // written as `result` (ok) or `error` (not ok)
};

using JobHandler = std::function<JobResult(const Job&, std::stop_token)>;

struct StreamSourceStats {
  bool connected = false;
  std::uint64_t read = 0;           // entries taken by XREADGROUP
  std::uint64_t claimed = 0;        // entries taken by XAUTOCLAIM
  std::uint64_t succeeded = 0;      // results written and acknowledged
  std::uint64_t retried = 0;        // failed attempts retried here
  std::uint64_t dead_lettered = 0;  // oversized entries included
  std::uint64_t oversized = 0;      // entries over max_entry_bytes / max_entry_fields
  std::uint64_t left_pending = 0;   // stopped before completing
  std::uint64_t refused = 0;        // refused or shed by the pool, submitted again later
  std::uint64_t reconnects = 0;
  std::size_t in_flight = 0;
};

class StreamSource {
 public:
  // Validates the options (throws Error(invalid_options) naming the field).
  // Does not connect: start() does.
  StreamSource(Pool& pool, StreamSourceOptions options, JobHandler handler);
  // stop(); does not wait. A job still in flight holds the source's shared
  // state and writes its outcome (and acks) when it ends, or stays pending
  // if the pool drops it. Call wait_idle() first to wait for them.
  ~StreamSource();
  StreamSource(const StreamSource&) = delete;
  StreamSource& operator=(const StreamSource&) = delete;

  // Starts the reader thread (it creates the group, with MKSTREAM, if
  // missing). Idempotent.
  void start();
  // Stops reading now; does not wait for jobs in flight (the pool's shutdown
  // decides their fate). Idempotent.
  void stop() noexcept;
  // Blocks until no job is in flight or the timeout passes.
  bool wait_idle(std::chrono::milliseconds timeout);

  [[nodiscard]] bool connected() const noexcept;
  [[nodiscard]] StreamSourceStats stats() const;
  [[nodiscard]] const StreamSourceOptions& options() const noexcept;

 private:
  std::shared_ptr<struct StreamSourceState> state_;
};

}  // namespace crew
