// crew/detail/pool_lifecycle.hpp: the pool's state (PoolState), the switch
// that makes workers drop queued tasks during a soft or hard shutdown, and
// the attention counter that tells workers to look up from the queue.
//
// Who touches what:
//   state_      written by the control calls (PoolControl::start, pause, resume,
//               shutdown, restart), each edge checked against
//               is_legal_transition; read by every submitter (admission),
//               by workers (pause, stop) and by the supervisor.
//   dropping_   set by a soft or hard shutdown (and by an escalation to
//               hard), cleared by restart; read by workers for each task
//               they pop, and by the supervisor.
//   attention_  bumped by any control call workers must notice (pause,
//               resume, resize, stop_worker, shutdown, restart); each worker
//               compares it with the value it last saw once per task, so a
//               bump costs the hot path one relaxed load.
// The state's seq_cst store and loads order a shutdown against submitters
// (PoolCore::after_push) and sleeping workers; the others need no more than
// acquire/release.
#pragma once

#include <atomic>
#include <cstdint>

#include "crew/detail/assert.hpp"
#include "crew/detail/cache_line.hpp"
#include "crew/pool_types.hpp"

namespace crew::detail {

class PoolLifecycle {
 public:
  [[nodiscard]] PoolState state(
      std::memory_order order = std::memory_order_acquire) const noexcept {
    return state_.load(order);
  }
  // Stopping, stopped or stopped after a timeout: no admission.
  [[nodiscard]] bool closed(std::memory_order order = std::memory_order_acquire) const noexcept {
    return state(order) >= PoolState::stopping;
  }
  // Moves to `to` from whatever the state is; returns the previous state.
  // The caller makes the change exclusive (PoolRuntime::mu, or the shutdown
  // sequence that alone may leave `stopping`).
  PoolState set(PoolState to) noexcept {
    const PoolState from = state_.load(std::memory_order_relaxed);
    CREW_ASSERT(is_legal_transition(from, to), "illegal pool state transition");
    state_.store(to, std::memory_order_seq_cst);
    return from;
  }
  // Moves from `from` to `to` if the state is `from`.
  bool transition(PoolState from, PoolState to) noexcept {
    CREW_ASSERT(is_legal_transition(from, to), "illegal pool state transition");
    return state_.compare_exchange_strong(from, to, std::memory_order_seq_cst);
  }

  void start_dropping() noexcept { dropping_.store(true, std::memory_order_seq_cst); }
  void stop_dropping() noexcept { dropping_.store(false, std::memory_order_seq_cst); }
  [[nodiscard]] bool dropping(std::memory_order order = std::memory_order_relaxed) const noexcept {
    return dropping_.load(order);
  }

  void call_attention() noexcept { attention_.fetch_add(1, std::memory_order_release); }
  [[nodiscard]] std::uint32_t attention(std::memory_order order) const noexcept {
    return attention_.load(order);
  }

 private:
  alignas(kCacheLine) std::atomic<PoolState> state_{PoolState::created};
  std::atomic<bool> dropping_{false};
  std::atomic<std::uint32_t> attention_{0};
};

}  // namespace crew::detail
