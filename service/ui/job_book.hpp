// service/ui/job_book.hpp: the jobs of POST /api/v1/jobs as the console sees
// them: those not yet ended (queued or running, each with its task handle,
// so that the console can cancel it) and a bounded history of outcomes.
//
// Thread safety: all member functions are thread-safe (one mutex). Callers
// are the I/O threads (a job's submission and completion, the console's
// snapshot and cancel), except started(), which a job's task calls on its
// worker: one relaxed atomic subtraction, no lock.
#pragma once

#include <atomic>
#include <chrono>
#include <crew/task.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jobs/jobs.hpp"

namespace crewd::ui {

using Clock = std::chrono::steady_clock;

// A job not yet ended.
struct LiveJob {
  std::uint64_t task_id = 0;
  std::string name;
  JobKind kind = JobKind::sleep;
  std::uint32_t timeout_ms = 0;
  Clock::time_point submitted;
  bool queued = true;      // not started yet (its task's status)
  std::string request_id;  // the request's X-Request-Id (the task's correlation id)
};

// A job that ended.
struct JobOutcome {
  std::uint64_t task_id = 0;
  std::string name;
  JobKind kind = JobKind::sleep;
  std::string outcome;   // succeeded, failed, cancelled, timed_out, rejected
  std::string reason;    // crew::Errc of a job that did not succeed, else empty
  double queue_ms = -1;  // -1: it never started
  double run_ms = -1;
  Clock::time_point ended;
  std::string request_id;  // the request's X-Request-Id (the task's correlation id)
};

// Which outcomes a history listing keeps; empty fields match all.
struct HistoryFilter {
  std::string outcome;  // one outcome, or empty
  std::string name;     // a part of the name, or empty
  [[nodiscard]] bool matches(const JobOutcome& o) const noexcept;
};

enum class CancelStatus : std::uint8_t {
  cancelled,       // it was queued and will never run
  stop_requested,  // it was running; its token is stopped
  not_found,       // no job with that task id (ended, or never)
};
[[nodiscard]] std::string_view to_string(CancelStatus s) noexcept;

class JobBook {
 public:
  explicit JobBook(std::size_t history) : history_cap_(history) {}
  JobBook(const JobBook&) = delete;
  JobBook& operator=(const JobBook&) = delete;

  // A job the jobs pool accepted; `handle` is its task's, shared with the
  // job's completion, which reads it on an I/O thread (cancel() does not
  // change the handle itself). `started`, set by the job's first step, says
  // whether it is still queued: a coroutine task's status is running from
  // its admission on. Without it, the handle's status says.
  void add(const JobRequest& job, std::shared_ptr<crew::Task<void>> handle,
           Clock::time_point submitted, std::shared_ptr<const std::atomic<bool>> started = nullptr);
  // The job's task started (its worker): one queued job fewer.
  void started() noexcept { queued_.fetch_sub(1, std::memory_order_relaxed); }
  // The job's completion: drops it from the live jobs and records `outcome`
  // (queue_ms < 0: it never started; reason to_string(Errc::rejected): refused at
  // admission, never counted as queued).
  void finish(JobOutcome outcome);
  // Cancels the live job of task `task_id` (Task::cancel).
  CancelStatus cancel(std::uint64_t task_id);
  // Whether cancel() stopped the live job of task `task_id`.
  [[nodiscard]] bool cancel_requested(std::uint64_t task_id) const;

  struct Listing {
    std::vector<LiveJob> queued;  // the oldest first, at most `rows`
    std::size_t queued_total = 0;
    std::vector<JobOutcome> recent;  // the newest first, at most `rows`, filtered
    std::size_t recent_total = 0;    // that match the filter
  };
  // At most `rows` rows of each list. Walks the live jobs in submission
  // order only until it has `rows` queued ones (the running ones, started
  // first, come before them); the count of queued jobs is kept by add(),
  // started() and finish(), so 10,000 queued jobs cost what 100 do.
  [[nodiscard]] Listing list(std::size_t rows, const HistoryFilter& filter) const;
  // The live jobs among `task_ids` (those of the running tasks), by id.
  [[nodiscard]] std::map<std::uint64_t, LiveJob> find(
      const std::vector<std::uint64_t>& task_ids) const;

 private:
  struct Entry {
    LiveJob job;
    std::shared_ptr<crew::Task<void>> handle;
    std::shared_ptr<const std::atomic<bool>> started;  // null: the handle's status says
    bool cancel_requested = false;
    [[nodiscard]] bool queued() const noexcept {
      return started ? !started->load(std::memory_order_relaxed) && !handle->ready()
                     : handle->status() == crew::TaskStatus::queued;
    }
  };
  // Jobs added and neither started nor finished unstarted. May dip below
  // zero for a moment: a task can start before add() has counted it.
  std::atomic<std::int64_t> queued_{0};
  mutable std::mutex mu_;
  std::map<std::uint64_t, Entry> live_;  // by task id: submission order
  std::deque<JobOutcome> history_;       // the newest last
  const std::size_t history_cap_;
};

}  // namespace crewd::ui
