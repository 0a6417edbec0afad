// The console's book of jobs (service/ui/job_book.hpp).
#include "ui/job_book.hpp"

#include <algorithm>
#include <utility>

namespace crewd::ui {

bool HistoryFilter::matches(const JobOutcome& o) const noexcept {
  if (!outcome.empty() && o.outcome != outcome) return false;
  return name.empty() || o.name.find(name) != std::string::npos;
}

std::string_view to_string(CancelStatus s) noexcept {
  switch (s) {
    case CancelStatus::cancelled:
      return "cancelled";
    case CancelStatus::stop_requested:
      return "stop_requested";
    case CancelStatus::not_found:
      return "not_found";
  }
  return "?";
}

void JobBook::add(const JobRequest& job, std::shared_ptr<crew::Task<void>> handle,
                  Clock::time_point submitted, std::shared_ptr<const std::atomic<bool>> started) {
  const std::uint64_t id = handle->id();
  const crew::TaskStatus status = handle->status();
  // Refused at admission: never queued, and never started() or finished
  // unstarted as an accepted job.
  if (id == 0 ||
      (status == crew::TaskStatus::rejected && handle->reason() == crew::Errc::rejected)) {
    return;
  }
  // Counted even when it is over already (a short job may have run on a
  // worker before this call): its started() or its finish() evens it out.
  queued_.fetch_add(1, std::memory_order_relaxed);
  if (crew::is_final(status)) return;
  Entry e{.job = {.task_id = id,
                  .name = job.name,
                  .kind = job.kind,
                  .timeout_ms = job.timeout_ms,
                  .submitted = submitted,
                  .request_id = std::string(handle->correlation_id())},
          .handle = std::move(handle),
          .started = std::move(started)};
  std::lock_guard lock(mu_);
  live_.emplace(id, std::move(e));
}

void JobBook::finish(JobOutcome outcome) {
  std::lock_guard lock(mu_);
  live_.erase(outcome.task_id);
  // An accepted job that never started (cancelled or dropped while queued,
  // expired); one refused at admission was never counted.
  if (outcome.queue_ms < 0 && outcome.reason != crew::to_string(crew::Errc::rejected)) {
    queued_.fetch_sub(1, std::memory_order_relaxed);
  }
  history_.push_back(std::move(outcome));
  while (history_.size() > history_cap_) history_.pop_front();
}

bool JobBook::cancel_requested(std::uint64_t task_id) const {
  std::lock_guard lock(mu_);
  const auto it = live_.find(task_id);
  return it != live_.end() && it->second.cancel_requested;
}

CancelStatus JobBook::cancel(std::uint64_t task_id) {
  std::lock_guard lock(mu_);
  const auto it = live_.find(task_id);
  if (it == live_.end()) return CancelStatus::not_found;
  // A queued task is destroyed unrun here, on this thread: its completion
  // is posted, never run inline, so finish() cannot run under this lock.
  switch (it->second.handle->cancel()) {
    case crew::CancelResult::cancelled:
      it->second.cancel_requested = true;
      return CancelStatus::cancelled;
    case crew::CancelResult::stop_requested:
      it->second.cancel_requested = true;
      return CancelStatus::stop_requested;
    case crew::CancelResult::not_interruptible:
    case crew::CancelResult::already_finished:
      break;
  }
  return CancelStatus::not_found;
}

JobBook::Listing JobBook::list(std::size_t rows, const HistoryFilter& filter) const {
  Listing out;
  std::lock_guard lock(mu_);
  for (const auto& [id, e] : live_) {
    if (out.queued.size() >= rows) break;
    if (e.queued()) out.queued.push_back(e.job);
  }
  out.queued_total = static_cast<std::size_t>(std::max<std::int64_t>(
      queued_.load(std::memory_order_relaxed), static_cast<std::int64_t>(out.queued.size())));
  for (auto it = history_.rbegin(); it != history_.rend(); ++it) {
    if (!filter.matches(*it)) continue;
    ++out.recent_total;
    if (out.recent.size() < rows) out.recent.push_back(*it);
  }
  return out;
}

std::map<std::uint64_t, LiveJob> JobBook::find(const std::vector<std::uint64_t>& task_ids) const {
  std::map<std::uint64_t, LiveJob> out;
  std::lock_guard lock(mu_);
  for (const std::uint64_t id : task_ids) {
    if (const auto it = live_.find(id); it != live_.end()) {
      out.emplace(id, it->second.job);
      out[id].queued = false;
    }
  }
  return out;
}

}  // namespace crewd::ui
