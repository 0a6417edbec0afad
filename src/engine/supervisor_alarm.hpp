// src/engine/supervisor_alarm.hpp (private): how a pool's supervisor sleeps and is
// woken. It sleeps until its next planned wake-up (the earliest deadline it
// knows of); a thread that arms an earlier deadline, or needs it for
// anything else, wakes it. The supervisor's work is src/engine/supervisor.cpp.
//
// Who touches what:
//   begin_scan, cancel, sleep_until  the supervisor thread only
//   need_by                          any thread that armed a deadline (a
//                                    worker starting a long task, a
//                                    submitter with a queue deadline)
//   wake, wake_all                   any thread (a stop was requested, the
//                                    supervisor must exit)
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "event_count.hpp"

namespace crew::detail {

class SupervisorAlarm {
 public:
  using Key = EventCount::Key;
  // A planned wake-up that never comes: sleep until woken.
  static constexpr std::int64_t kNever = INT64_MAX;

  SupervisorAlarm() = default;
  SupervisorAlarm(const SupervisorAlarm&) = delete;
  SupervisorAlarm& operator=(const SupervisorAlarm&) = delete;

  // Before a scan: a wake from here on is kept for sleep_until, and while
  // it scans every need_by wakes it (it may have read the heap already).
  [[nodiscard]] Key begin_scan() noexcept {
    const Key key = ec_.prepare_wait();
    next_ns_.store(0, std::memory_order_seq_cst);
    return key;
  }
  // Ends a scan without sleeping.
  void cancel() noexcept { ec_.cancel_wait(); }
  // Sleeps until steady_clock `next_ns` (kNever: until woken), or a wake
  // since begin_scan.
  void sleep_until(Key key, std::int64_t next_ns) noexcept {
    next_ns_.store(next_ns, std::memory_order_seq_cst);
    (void)ec_.wait(key, next_ns == kNever ? kNoDeadline
                                          : std::chrono::steady_clock::time_point(
                                                std::chrono::nanoseconds(next_ns)));
  }

  // A deadline at steady_clock `at_ns` was armed: wakes the supervisor if it
  // plans to sleep past it (or is scanning).
  void need_by(std::int64_t at_ns) noexcept {
    const std::int64_t next = next_ns_.load(std::memory_order_seq_cst);
    if (next == 0 || at_ns < next) ec_.notify_one();
  }
  void wake() noexcept { ec_.notify_one(); }
  void wake_all() noexcept { ec_.notify_all(); }

 private:
  EventCount ec_;
  // The planned wake-up, 0 while it scans.
  std::atomic<std::int64_t> next_ns_{0};
};

}  // namespace crew::detail
