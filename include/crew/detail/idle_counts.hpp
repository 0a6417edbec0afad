// crew/detail/idle_counts.hpp: the counts of a pool's wake-up policy that
// the inline submission path reads: who holds a spinning token, whether a
// spinner is running (its heartbeat), how many workers sleep and how many
// of those watch the queues. The policy itself, with the stack of sleeping
// workers, is the engine's WakePolicy (src/engine/wake_policy.hpp).
//
// Who touches what:
//   spinning tokens  a worker takes one to poll the queues and gives it back;
//                    a waker takes one for the worker it wakes or starts, and
//                    that worker gives it back. Submitters read the count
//                    (seq_cst, after their push) to decide whether to wake
//                    anyone.
//   sleepers         counted by WakePolicy under its stack's mutex as
//                    workers join and leave the stack; read by anyone.
//   watchers         a sleeper that looks at the queues every kWatchNs
//                    counts itself from its first timed sleep until it
//                    stops watching or leaves the idle stack (its own
//                    thread); a sleeper starts watching only when the
//                    count is 0, so it is 0 or 1 (2 for a moment).
//   heartbeat        a spinner notes the time every few polls, and a waker
//                    when it hands a token to a worker it wakes; submitters
//                    read it (relaxed) when a token is held.
#pragma once

#include <atomic>
#include <cstdint>

#include "crew/detail/cache_line.hpp"
#include "crew/detail/clock.hpp"

namespace crew::detail {

class IdleCounts {
 public:
  // A token whose holder has not beaten for this long belongs to a worker
  // that is not running (preempted, or its virtual CPU descheduled): see
  // spinner_running(). A spinner beats every microsecond or so.
  static constexpr std::uint64_t kStaleUs = 10;
  // A worker woken or started with a token has this long to begin spinning
  // before its token counts as stale (a futex wake-up of a worker on an idle
  // CPU took 5 us at the median, 7 us at p90, on the 2-CPU VM crew is
  // measured on).
  static constexpr std::uint64_t kWakeGraceUs = 20;

  IdleCounts() noexcept
      : stale_(static_cast<std::int64_t>(kStaleUs * cycles_per_us())),
        wake_grace_(static_cast<std::int64_t>((kWakeGraceUs - kStaleUs) * cycles_per_us())) {}
  IdleCounts(const IdleCounts&) = delete;
  IdleCounts& operator=(const IdleCounts&) = delete;

  // ---- spinning tokens ----
  [[nodiscard]] int spinning() const noexcept { return spinning_.load(std::memory_order_seq_cst); }
  // A worker takes a token for itself (and beats as it starts to poll).
  void take_token() noexcept { spinning_.fetch_add(1, std::memory_order_seq_cst); }
  // A token for a worker being started, which has kWakeGraceUs to poll.
  void hand_token() noexcept {
    take_token();
    expect_spinner();
  }
  // Gives a token back; true if it was the last one held.
  bool give_token() noexcept { return spinning_.fetch_sub(1, std::memory_order_seq_cst) == 1; }

  // ---- the spinners' heartbeat ----
  // Notes that a token holder is polling now (a spinner, every few polls).
  void beat() noexcept { beat_.store(cycles(), std::memory_order_relaxed); }
  // Notes a worker on its way to poll: fresh for kWakeGraceUs.
  void expect_spinner() noexcept {
    beat_.store(cycles() + static_cast<std::uint64_t>(wake_grace_), std::memory_order_relaxed);
  }
  // Whether some worker holds a token and is running: one beat within
  // kStaleUs (or a wake-up within kWakeGraceUs). A token alone is not
  // enough: a spinner preempted by the thread that submits (the two share a
  // CPU) keeps its token for a whole time slice while nobody polls. The
  // answer only decides whether a submitter brings in help, so a stale beat
  // can cost a spare wake-up, never a lost one.
  [[nodiscard]] bool spinner_running() const noexcept {
    if (spinning() == 0) return false;
    const auto age = static_cast<std::int64_t>(cycles() - beat_.load(std::memory_order_relaxed));
    return age < stale_;
  }

  // ---- sleepers and watchers (src/engine/wake.cpp) ----
  [[nodiscard]] int sleepers() const noexcept { return sleepers_.load(std::memory_order_seq_cst); }
  [[nodiscard]] int watchers() const noexcept { return watchers_.load(std::memory_order_seq_cst); }
  // A worker joined or left the sleeper stack (WakePolicy, under its
  // stack's mutex): seq_cst, so that a submitter that pushed after the
  // count went up sees the sleeper, and the sleeper, re-checking the
  // queues after it, sees the task.
  void add_sleeper() noexcept { sleepers_.fetch_add(1, std::memory_order_seq_cst); }
  void remove_sleeper() noexcept { sleepers_.fetch_sub(1, std::memory_order_seq_cst); }
  // A sleeper starts and stops watching the queues (see sleep_for_work).
  void begin_watch() noexcept { watchers_.fetch_add(1, std::memory_order_seq_cst); }
  void end_watch() noexcept { watchers_.fetch_sub(1, std::memory_order_seq_cst); }

 private:
  alignas(kCacheLine) std::atomic<int> spinning_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<int> watchers_{0};
  const std::int64_t stale_;       // kStaleUs in cycles()
  const std::int64_t wake_grace_;  // kWakeGraceUs - kStaleUs in cycles()
  // Written every microsecond or so while a worker spins: off the counts'
  // line, which every submission reads.
  alignas(kCacheLine) std::atomic<std::uint64_t> beat_{0};
};

}  // namespace crew::detail
