// StreamSource: a Redis Streams consumer feeding a crew pool. The contract
// is in include/crew/stream_source.hpp; the data flow:
//
//   reader thread (owns reader_):  XREADGROUP / XAUTOCLAIM (+ XPENDING for a
//       claimed entry's delivery count) -> Job -> pool.post(long task);
//       re-dispatches due retries; waits while max_in_flight jobs are out,
//       and while it backs off after the pool refused or shed a job;
//       every claim_idle / 4, XCLAIM JUSTID on the entries it holds, which
//       resets their idle time so that no live consumer claims them.
//   worker (a pool task):          handler(job) -> writer_ (under writer_mu):
//       XADD results + XACK in one round trip, or XADD dead + XACK, or a
//       retry entry for the reader thread. The entry leaves `held` last.
//
// The state is shared with the tasks in flight, so a task that runs after
// the StreamSource object is gone touches only memory it co-owns.
#include "crew/stream_source.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <optional>
#include <random>
#include <thread>
#include <unordered_set>

#include "crew/detail/mutex.hpp"
#include "crew/error.hpp"
#include "crew/pool.hpp"
#include "overload_backoff.hpp"
#include "redis_conn.hpp"
#include "stream_reading.hpp"

namespace crew {

using detail::entries_of;
using detail::Entry;
using detail::Reply;
using detail::text_of;
using detail::validated;

std::string Job::field(std::string_view name, std::string_view fallback) const {
  for (const auto& [k, v] : fields) {
    if (k == name) return v;
  }
  return std::string(fallback);
}

namespace {

using Clock = std::chrono::steady_clock;

std::string ms_text(Clock::duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

}  // namespace

// A job to submit again at `due`: a failed attempt's retry, or one the pool
// refused or shed (then `oversize` is kept: why it is to be dead-lettered
// unrun, if it is).
struct Retry {
  Clock::time_point due;
  Job job;
  std::string oversize{};
};

struct StreamSourceState : std::enable_shared_from_this<StreamSourceState> {
  StreamSourceState(Pool& p, StreamSourceOptions o, JobHandler h)
      : pool(p),
        opts(validated(std::move(o), p)),
        handler(std::move(h)),
        reader(opts.host, opts.port, opts.password, opts.command_timeout),
        writer(opts.host, opts.port, opts.password, opts.command_timeout) {}

  Pool& pool;
  const StreamSourceOptions opts;
  const JobHandler handler;

  detail::RedisConn reader;  // the reader thread only
  detail::Mutex writer_mu;
  detail::RedisConn writer CREW_GUARDED_BY(writer_mu);

  // The ids of the entries in flight here (dispatched to the pool or
  // waiting for a retry): read by this consumer and neither acknowledged
  // nor given up. Their count is what max_in_flight bounds.
  detail::Mutex mu;
  std::condition_variable cv;  // an entry left `held`, a retry added, stop
  std::unordered_set<std::string> held CREW_GUARDED_BY(mu);
  std::vector<Retry> retries CREW_GUARDED_BY(mu);
  bool stopping CREW_GUARDED_BY(mu) = false;
  // The overload backoff (see the header): nothing is read or submitted
  // while it is paused.
  detail::OverloadBackoff overload CREW_GUARDED_BY(mu){
      opts.overload_backoff_min, opts.overload_backoff_max, std::random_device{}()};

  std::atomic<bool> stopped{false};  // mirrors `stopping` for lock-free checks
  // Each connection's health; the source is connected when both are.
  std::atomic<bool> reader_ok{false};
  std::atomic<bool> writer_ok{true};
  Clock::time_point last_reader_io{};  // reader thread only
  std::atomic<std::uint64_t> n_read{0}, n_claimed{0}, n_succeeded{0}, n_retried{0}, n_dead{0},
      n_oversized{0}, n_pending{0}, n_reconnects{0}, n_refused{0};
  std::string claim_cursor = "0-0";  // reader thread only
  Clock::time_point next_claim{};    // reader thread only
  Clock::time_point next_refresh{};  // reader thread only
  std::jthread thread;

  void log(LogLevel level, const std::string& message) const noexcept {
    if (level >= opts.logger->level()) {
      opts.logger->log(level, {.pool = pool.name(), .task = "stream " + opts.stream}, message);
    }
  }

  // ---- reader thread ----

  void run(std::stop_token stop) {
    auto backoff = opts.reconnect_min;
    bool ever_connected = false;
    while (!stop.stop_requested()) {
      if (!reader.connected()) {
        if (!connect_reader()) {
          reader_ok = false;
          log(LogLevel::warning, "cannot reach Redis (" + reader.error() + "); retrying in " +
                                     std::to_string(backoff.count()) + " ms");
          sleep_for(stop, backoff);
          backoff = std::min(backoff * 2, opts.reconnect_max);
          continue;
        }
        if (ever_connected) {
          n_reconnects.fetch_add(1);
          log(LogLevel::info, "reconnected to Redis");
        }
        ever_connected = true;
        reader_ok = true;
        backoff = opts.reconnect_min;
      }
      dispatch_due_retries();
      refresh_held();
      const std::size_t room = free_room(stop);
      if (room == 0) {
        // No room, so no reads: check the connection now and then anyway.
        if (Clock::now() - last_reader_io > std::chrono::seconds(1)) {
          last_reader_io = Clock::now();
          if (!reader.command({"PING"})) reader_ok = false;
        }
        continue;
      }
      last_reader_io = Clock::now();
      if (Clock::now() >= next_claim) {
        // While the scan of the pending entries is not through, the next
        // round follows at once: a busy instance claims only `room` entries
        // per round, and a dead one's jobs must not wait a round each.
        const bool more = claim(room);
        next_claim =
            more ? Clock::now()
                 : Clock::now() + std::max<Clock::duration>(opts.block, opts.claim_idle / 4);
        continue;
      }
      read_new(room);
    }
  }

  bool connect_reader() {
    if (!reader.ensure()) return false;
    // The group reads the stream from its start, so jobs added before any
    // consumer existed are not skipped.
    Reply r = reader.command({"XGROUP", "CREATE", opts.stream, opts.group, "0", "MKSTREAM"});
    if (!r) return false;
    if (r->type == REDIS_REPLY_ERROR && text_of(r.get()).rfind("BUSYGROUP", 0) != 0) {
      log(LogLevel::error, "XGROUP CREATE failed: " + std::string(text_of(r.get())));
      reader.close();
      return false;
    }
    return true;
  }

  void sleep_for(std::stop_token& stop, std::chrono::milliseconds d) {
    detail::MutexLock lock(mu);
    const auto until = Clock::now() + d;
    while (!stop.stop_requested() && !stopping) {
      if (cv.wait_until(lock.native(), until) == std::cv_status::timeout) break;
    }
  }

  // How many more jobs may be taken now; waits (up to `block`) while none,
  // and none are while the overload backoff lasts.
  std::size_t free_room(std::stop_token& stop) {
    detail::MutexLock lock(mu);
    if (const auto now = Clock::now(); overload.paused(now)) {
      if (!stopping && !stop.stop_requested()) {
        cv.wait_until(lock.native(),
                      std::min<Clock::time_point>(overload.until(), now + opts.block));
      }
      return 0;
    }
    if (held.size() >= opts.max_in_flight && !stopping && !stop.stop_requested()) {
      cv.wait_for(lock.native(), opts.block);
    }
    if (stopping || held.size() >= opts.max_in_flight) return 0;
    return std::min(opts.max_in_flight - held.size(), opts.max_batch);
  }

  void read_new(std::size_t room) {
    reader.set_timeout(opts.command_timeout + opts.block);
    Reply r = reader.command({"XREADGROUP", "GROUP", opts.group, opts.consumer, "COUNT",
                              std::to_string(room), "BLOCK", std::to_string(opts.block.count()),
                              "STREAMS", opts.stream, ">"});
    reader.set_timeout(opts.command_timeout);
    if (!r) return;  // connection lost: reconnect on the next turn
    if (r->type == REDIS_REPLY_ERROR) {
      if (text_of(r.get()).rfind("NOGROUP", 0) == 0) reader.close();  // recreate the group
      log(LogLevel::error, "XREADGROUP failed: " + std::string(text_of(r.get())));
      return;
    }
    if (r->type != REDIS_REPLY_ARRAY) return;  // nil: nothing new within `block`
    for (std::size_t s = 0; s < r->elements; ++s) {
      const redisReply* stream = r->element[s];
      if (stream->type != REDIS_REPLY_ARRAY || stream->elements < 2) continue;
      for (Entry& entry : entries_of(stream->element[1], opts)) {
        n_read.fetch_add(1);
        dispatch(std::move(entry.job), std::move(entry.refused));
      }
    }
  }

  // Takes over entries other consumers left pending longer than claim_idle.
  // True if the scan of the group's pending entries is not through yet.
  bool claim(std::size_t room) {
    Reply r = reader.command({"XAUTOCLAIM", opts.stream, opts.group, opts.consumer,
                              std::to_string(opts.claim_idle.count()), claim_cursor, "COUNT",
                              std::to_string(room)});
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 2) {
      if (r && r->type == REDIS_REPLY_ERROR) {
        log(LogLevel::error, "XAUTOCLAIM failed: " + std::string(text_of(r.get())));
      }
      return false;
    }
    claim_cursor = std::string(text_of(r->element[0]));
    for (Entry& entry : entries_of(r->element[1], opts)) {
      Job& job = entry.job;
      // One of its own, idle that long only if refresh_held() was late (the
      // reader was stalled): it is running or queued here already.
      if (is_held(job.id)) continue;
      job.attempt = delivery_count(job.id);
      n_claimed.fetch_add(1);
      log(LogLevel::info, "claimed " + job.id + " (attempt " + std::to_string(job.attempt) + ")");
      dispatch(std::move(job), std::move(entry.refused));
    }
    return claim_cursor != "0-0";
  }

  [[nodiscard]] bool is_held(const std::string& id) {
    detail::MutexLock lock(mu);
    return held.contains(id);
  }

  // Resets the idle time of the entries held here (XCLAIM to this consumer,
  // JUSTID: the delivery count is left alone), so that a job running longer
  // than claim_idle is not claimed by another live consumer, or by this one.
  // Only entries idle for half of claim_idle are touched; it runs every
  // quarter. An entry another consumer claimed meanwhile (this reader was
  // stalled past claim_idle) is already running there too; claiming it back
  // changes no outcome, since either acknowledgement settles it.
  void refresh_held() {
    const auto now = Clock::now();
    if (now < next_refresh) return;
    next_refresh =
        now + std::max<Clock::duration>(opts.claim_idle / 4, std::chrono::milliseconds(1));
    std::vector<std::string> command = {"XCLAIM", opts.stream, opts.group, opts.consumer,
                                        std::to_string((opts.claim_idle / 2).count())};
    {
      detail::MutexLock lock(mu);
      if (held.empty()) return;
      command.insert(command.end(), held.begin(), held.end());
    }
    command.emplace_back("JUSTID");
    Reply r = reader.command(command);
    if (r && r->type == REDIS_REPLY_ERROR) {
      log(LogLevel::error, "XCLAIM (refresh) failed: " + std::string(text_of(r.get())));
    }
  }

  // Redis' count of deliveries of a pending entry (XAUTOCLAIM counts one).
  std::uint32_t delivery_count(const std::string& id) {
    Reply r = reader.command({"XPENDING", opts.stream, opts.group, id, id, "1"});
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 1) {
      const redisReply* e = r->element[0];
      if (e->type == REDIS_REPLY_ARRAY && e->elements >= 4 &&
          e->element[3]->type == REDIS_REPLY_INTEGER) {
        return static_cast<std::uint32_t>(
            std::clamp<long long>(e->element[3]->integer, 1, INT_MAX));
      }
    }
    return 2;  // it was delivered before, at least once
  }

  void dispatch_due_retries() {
    std::vector<Retry> due;
    {
      detail::MutexLock lock(mu);
      const auto now = Clock::now();
      if (overload.paused(now)) return;
      for (auto it = retries.begin(); it != retries.end();) {
        if (it->due <= now) {
          due.push_back(std::move(*it));
          it = retries.erase(it);  // stays held: dispatch() finds it there
        } else {
          ++it;
        }
      }
    }
    for (Retry& r : due) dispatch(std::move(r.job), std::move(r.oversize));
  }

  // Owned by a posted task, with its job. If the pool destroys the task
  // without running it, the job goes back to the source (unrun()).
  class Ticket {
   public:
    Ticket(std::shared_ptr<StreamSourceState> s, Job job, std::string oversize)
        : state_(std::move(s)), job_(std::move(job)), oversize_(std::move(oversize)) {}
    Ticket(Ticket&& o) noexcept = default;
    Ticket& operator=(Ticket&&) = delete;
    ~Ticket() {
      if (state_) state_->unrun(std::move(job_), std::move(oversize_));
    }
    // The task runs: it settles the job itself.
    std::shared_ptr<StreamSourceState> take() noexcept { return std::move(state_); }
    Job& job() noexcept { return job_; }
    [[nodiscard]] const std::string& oversize() const noexcept { return oversize_; }

   private:
    std::shared_ptr<StreamSourceState> state_;
    Job job_;
    std::string oversize_;
  };

  // `oversize`: why the entry is too large to run (entries_of); it is then
  // dead-lettered by the task instead, on a worker like every outcome.
  // During an overload backoff the job waits for its end, unsubmitted.
  void dispatch(Job job, std::string oversize = {}) {
    {
      detail::MutexLock lock(mu);
      held.insert(job.id);
      if (overload.paused(Clock::now())) {
        retries.push_back({overload.until(), std::move(job), std::move(oversize)});
        return;
      }
    }
    std::string name = "stream-job " + job.id;
    const Admission admission = pool.post(
        [ticket = Ticket(shared_from_this(), std::move(job), std::move(oversize))](
            std::stop_token stop) mutable {
          std::shared_ptr<StreamSourceState> self = ticket.take();
          if (ticket.oversize().empty()) {
            self->run_job(std::move(ticket.job()), stop);
          } else {
            self->dead_letter_oversized(ticket.job(), ticket.oversize());
          }
        },
        {.name = std::move(name), .timeout = opts.job_timeout, .priority = opts.priority});
    if (admission == Admission::accepted) {
      detail::MutexLock lock(mu);
      overload.admitted();
    }
  }

  // A job the pool destroyed unrun: refused at submission, shed by the
  // overload controller, or dropped by a shutdown. Runs on the submitting
  // (reader) thread or on the worker that shed it. Unless the source or the
  // pool is stopping, the job stays held and is submitted again after a
  // backoff; else it is left pending, for this consumer or another to
  // claim after claim_idle.
  void unrun(Job job, std::string oversize) noexcept {
    if (!stopped.load() && pool.state() < PoolState::stopping) {
      const auto estimate =
          std::chrono::duration_cast<Clock::duration>(pool.overload_hint().wait_estimate);
      detail::MutexLock lock(mu);
      if (!stopping) {
        overload.refused(Clock::now(), estimate);
        retries.push_back({overload.until(), std::move(job), std::move(oversize)});
        n_refused.fetch_add(1);
        cv.notify_all();
        return;
      }
    }
    n_pending.fetch_add(1);
    release(job.id);
  }

  // An entry over the size limits: its outcome without running it.
  void dead_letter_oversized(const Job& job, const std::string& why) noexcept {
    try {
      n_oversized.fetch_add(1);
      if (finish(job, "dead", "error", why, Clock::duration::zero(), opts.dead_letter_stream)) {
        n_dead.fetch_add(1);
        log(LogLevel::warning, "job " + job.id + " dead-lettered unrun: " + why);
      }
    } catch (...) {  // out of memory: it stays pending, and is read again later
      n_pending.fetch_add(1);
    }
    release(job.id);
  }

  // ---- workers ----

  void run_job(Job job, const std::stop_token& stop) noexcept {
    const auto start = Clock::now();
    JobResult result;
    try {
      result = handler(job, stop);
    } catch (const std::exception& e) {
      result = {false, e.what()};
    } catch (...) {
      result = {false, "an exception not derived from std::exception"};
    }
    const auto run_time = Clock::now() - start;
    if (stop.stop_requested()) {
      if (stopped.load() || pool.state() >= PoolState::stopping) {
        n_pending.fetch_add(1);  // stopped by a shutdown: not completed, not acknowledged
        release(job.id);
        return;
      }
      result = {false, "timed out"};  // the job's own deadline stopped it
    }
    if (result.ok) {
      if (finish(job, "ok", "result", result.value, run_time, opts.results_stream)) {
        n_succeeded.fetch_add(1);
      }
    } else if (job.attempt < opts.max_attempts) {
      n_retried.fetch_add(1);
      log(LogLevel::warning, "job " + job.id + " attempt " + std::to_string(job.attempt) +
                                 " failed: " + result.value + "; retrying");
      const auto delay = opts.retry_backoff * (1LL << std::min<std::uint32_t>(job.attempt - 1, 20));
      ++job.attempt;
      detail::MutexLock lock(mu);
      if (!stopping) {
        retries.push_back({Clock::now() + delay, std::move(job)});  // stays in flight
        cv.notify_all();
        return;
      }
      // Stopped: no reader will retry it here; it stays pending.
      n_pending.fetch_add(1);
      held.erase(job.id);
      cv.notify_all();
      return;
    } else {
      if (finish(job, "dead", "error", result.value, run_time, opts.dead_letter_stream)) {
        n_dead.fetch_add(1);
        log(LogLevel::warning, "job " + job.id + " dead-lettered after " +
                                   std::to_string(job.attempt) + " attempts: " + result.value);
      }
    }
    release(job.id);
  }

  // Writes the outcome, then acknowledges, in one round trip. Retries with
  // reconnection until it succeeds or the source stops; false if it gave
  // up (the entry stays pending: it will be delivered again).
  bool finish(const Job& job, const char* status, const char* key, const std::string& value,
              Clock::duration run_time, const std::string& stream) {
    std::vector<std::string> add = {"XADD",
                                    stream,
                                    "*",
                                    "job",
                                    job.id,
                                    "attempt",
                                    std::to_string(job.attempt),
                                    "status",
                                    status,
                                    key,
                                    value,
                                    "instance",
                                    opts.instance_id,
                                    "run_ms",
                                    ms_text(run_time)};
    if (stream == opts.dead_letter_stream) {
      for (const auto& [k, v] : job.fields) {
        add.push_back("field:" + k);
        add.push_back(v);
      }
    }
    const std::vector<std::vector<std::string>> commands = {
        add, {"XACK", opts.stream, opts.group, job.id}};
    auto backoff = opts.reconnect_min;
    for (;;) {
      std::vector<Reply> replies;
      bool ok = false;
      {
        detail::MutexLock lock(writer_mu);
        ok = writer.pipeline(commands, replies);
      }
      if (ok != writer_ok.load()) {
        writer_ok = ok;
        if (ok) n_reconnects.fetch_add(1);
      }
      if (ok) {
        for (const Reply& r : replies) {
          if (r->type == REDIS_REPLY_ERROR) {
            log(LogLevel::error,
                "writing the outcome of " + job.id + " failed: " + std::string(text_of(r.get())));
            n_pending.fetch_add(1);
            return false;
          }
        }
        return true;
      }
      if (stopped.load()) {
        n_pending.fetch_add(1);
        return false;
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, opts.reconnect_max);
    }
  }

  void release(const std::string& id) {
    detail::MutexLock lock(mu);
    held.erase(id);
    cv.notify_all();
  }
};

StreamSource::StreamSource(Pool& pool, StreamSourceOptions options, JobHandler handler)
    : state_(std::make_shared<StreamSourceState>(pool, std::move(options), std::move(handler))) {
  if (!state_->handler) detail::invalid_option("handler", "must not be empty");
}

StreamSource::~StreamSource() { stop(); }

void StreamSource::start() {
  StreamSourceState& s = *state_;
  detail::MutexLock lock(s.mu);
  if (s.thread.joinable() || s.stopping) return;
  s.thread = std::jthread([st = state_](std::stop_token stop) { st->run(stop); });
}

void StreamSource::stop() noexcept {
  StreamSourceState& s = *state_;
  {
    detail::MutexLock lock(s.mu);
    s.stopping = true;
    s.stopped = true;
    // Retries not yet due are not attempted again here: their entries stay
    // pending for another consumer.
    s.n_pending.fetch_add(s.retries.size());
    for (const Retry& r : s.retries) s.held.erase(r.job.id);
    s.retries.clear();
    s.cv.notify_all();
  }
  if (s.thread.joinable()) {
    s.thread.request_stop();
    s.thread.join();
  }
  s.reader_ok = false;
}

bool StreamSource::wait_idle(std::chrono::milliseconds timeout) {
  StreamSourceState& s = *state_;
  detail::MutexLock lock(s.mu);
  const auto until = detail::saturating_deadline(Clock::now(), timeout);
  while (!s.held.empty()) {
    if (s.cv.wait_until(lock.native(), until) == std::cv_status::timeout) return s.held.empty();
  }
  return true;
}

bool StreamSource::connected() const noexcept {
  return state_->reader_ok.load() && state_->writer_ok.load();
}

StreamSourceStats StreamSource::stats() const {
  StreamSourceState& s = *state_;
  StreamSourceStats out;
  out.connected = s.reader_ok.load() && s.writer_ok.load();
  out.read = s.n_read.load();
  out.claimed = s.n_claimed.load();
  out.succeeded = s.n_succeeded.load();
  out.retried = s.n_retried.load();
  out.dead_lettered = s.n_dead.load();
  out.oversized = s.n_oversized.load();
  out.left_pending = s.n_pending.load();
  out.refused = s.n_refused.load();
  out.reconnects = s.n_reconnects.load();
  detail::MutexLock lock(s.mu);
  out.in_flight = s.held.size();
  return out;
}

const StreamSourceOptions& StreamSource::options() const noexcept { return state_->opts; }

}  // namespace crew
