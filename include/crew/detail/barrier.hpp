// crew/detail/barrier.hpp: an asymmetric fence for a worker's push into its
// own local queue.
//
// That push is the hottest store of fork-join code, and ordering it before
// the loads that follow it (the pool's state, then who spins or sleeps)
// takes a full fence per task. Where the kernel offers membarrier(2)'s
// private expedited command, the push instead pays only a compiler barrier
// (light_fence), and the rare thread that must see every push made before
// its own store (a shutdown that changed the state and is about to sweep
// the queues) runs heavy_fence: every running thread of the process passes
// a full fence meanwhile, so a pusher either saw the new state or its push
// is visible to the sweep. Without membarrier both are full fences.
//
// What the light push gives up: a worker going to sleep may miss a push
// made at the same instant by another worker (both read before the other's
// store lands). The pushing worker is awake and runs its own queue when
// its current task returns; and a sleeper that fell asleep while another
// worker was awake watches the queue every kWatchNs (wake.cpp), so a
// pushed task waits at most that long for a second worker.
#pragma once

#include <atomic>

namespace crew::detail {

// Set once, by the first pool constructed, if membarrier is registered.
inline std::atomic<bool> g_light_fences{false};

// Registers the process for membarrier's private expedited command once,
// and sets g_light_fences if that worked. Thread-safe; cheap after the
// first call.
void enable_light_fences() noexcept;

// The push side: orders the caller's earlier stores before its later loads
// against heavy_fence (a full fence if light fences are off).
[[gnu::always_inline]] inline void light_fence() noexcept {
  if (g_light_fences.load(std::memory_order_relaxed)) [[likely]] {
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}

// The other side: after it returns, every light_fence of another thread
// acts as a full fence against this one. A system call (microseconds);
// for rare paths only.
void heavy_fence() noexcept;

}  // namespace crew::detail
