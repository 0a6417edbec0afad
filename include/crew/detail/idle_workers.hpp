// crew/detail/idle_workers.hpp: the state of a pool's wake-up policy: who
// holds a spinning token, and the stack of sleeping workers. The policy
// itself (when to spin, sleep, wake) is PoolCore's, in src/engine/wake.cpp.
//
// Who touches what:
//   spinning tokens  a worker takes one to poll the queues and gives it back;
//                    a waker takes one for the worker it wakes or starts, and
//                    that worker gives it back. Submitters read the count
//                    (seq_cst, after their push) to decide whether to wake
//                    anyone.
//   sleeper stack    a worker pushes itself and takes itself off (leave);
//                    wakers pop workers (wake_one, wake_all). All under mu_,
//                    which also guards Worker::in_idle_stack and
//                    Worker::waker_cpu. The count is stored under mu_ and
//                    read by anyone.
//   watchers         a sleeper that looks at the queues every kWatchNs
//                    counts itself from its first timed sleep until it
//                    leaves the idle stack (its own thread).
//   heartbeat        a spinner notes the time every few polls, and a waker
//                    when it hands a token to a worker it wakes; submitters
//                    read it (relaxed) when a token is held.
#pragma once

#include <atomic>
#include <vector>

#include "crew/detail/cache_line.hpp"
#include "crew/detail/clock.hpp"
#include "crew/detail/mutex.hpp"
#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

struct Worker;

class IdleWorkers {
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

  IdleWorkers() noexcept
      : stale_(static_cast<std::int64_t>(kStaleUs * cycles_per_us())),
        wake_grace_(static_cast<std::int64_t>((kWakeGraceUs - kStaleUs) * cycles_per_us())) {}
  IdleWorkers(const IdleWorkers&) = delete;
  IdleWorkers& operator=(const IdleWorkers&) = delete;

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

  // ---- sleepers (src/engine/wake.cpp) ----
  [[nodiscard]] int sleepers() const noexcept { return sleepers_.load(std::memory_order_seq_cst); }
  [[nodiscard]] int watchers() const noexcept { return watchers_.load(std::memory_order_seq_cst); }
  // Pushes `w` (a worker about to sleep, on its own thread) on the stack, at
  // the bottom if `bottom`; it is counted in sleepers() (seq_cst) on return.
  void push(Worker& w, bool bottom) noexcept;
  // Takes `w` off the stack (its own thread). False if a waker popped it
  // first, and so handed it a spinning token.
  bool leave(Worker& w) noexcept;
  // Pops the top sleeper, hands it a spinning token (and kWakeGraceUs to
  // start polling), notes `waker_cpu` in it and wakes it. False if nobody
  // sleeps. Any thread.
  bool wake_one(int waker_cpu) noexcept;
  // Pops and wakes every sleeper, each with a token (waker_cpu -1: not a
  // wake-up for work). Any thread.
  void wake_all() noexcept;
  // Returns once no waker is inside wake_one or wake_all, which touch a
  // popped worker until its futex wake returns: an exiting worker calls it
  // before its memory can go.
  void quiesce() noexcept;
  // A sleeper starts and stops watching the queues (see sleep_for_work).
  void begin_watch() noexcept { watchers_.fetch_add(1, std::memory_order_seq_cst); }
  void end_watch() noexcept { watchers_.fetch_sub(1, std::memory_order_seq_cst); }

 private:
  void pop_locked(Worker& w, int waker_cpu) noexcept CREW_REQUIRES(mu_);

  alignas(kCacheLine) std::atomic<int> spinning_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<int> watchers_{0};
  const std::int64_t stale_;       // kStaleUs in cycles()
  const std::int64_t wake_grace_;  // kWakeGraceUs - kStaleUs in cycles()
  // Written every microsecond or so while a worker spins: off the counts'
  // line, which every submission reads.
  alignas(kCacheLine) std::atomic<std::uint64_t> beat_{0};
  // LIFO: the most recently idle worker is woken first, so the others can
  // reach their idle timeout; a worker that was woken onto its waker's CPU
  // goes to the bottom (Worker::crowded). Off the counts' line, which every
  // submission reads.
  alignas(kCacheLine) Mutex mu_;
  std::vector<Worker*> stack_ CREW_GUARDED_BY(mu_);
};

}  // namespace crew::detail
