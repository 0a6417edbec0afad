// crew/sharded_pool.hpp: N pools behind one submit (ants' MultiPool).
//
// A ShardedPool owns `shards` crew::Pool objects built from one PoolOptions
// and places each task on one of them:
//   round_robin   the shards in turn
//   least_loaded  the shard with the fewest tasks placed and not ended
// Submission (post, try_post, submit, try_submit, submit_wait) reads as on
// crew::Pool. stats() adds up the shards; shutdown() stops all of them at
// once, under one timeout, and merges their reports.
//
// Why shards: each pool has its own queue, workers and supervisor, so
// producers on many cores contend less, and a stalled shard (paused, full)
// leaves the others running.
//
// A task submitted from inside a task of a shard goes to that same shard,
// so that a worker waiting on its subtask can run it itself (Task::wait's
// rule) and nested submissions never deadlock across shards.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "crew/detail/submit_api.hpp"
#include "crew/error.hpp"
#include "crew/pool.hpp"
#include "crew/pool_types.hpp"
#include "crew/task.hpp"

namespace crew {

enum class Placement : std::uint8_t {
  round_robin,   // shard (n mod shards) for the n-th submission
  least_loaded,  // the shard with the fewest tasks placed and not ended yet
};

[[nodiscard]] std::string_view to_string(Placement p) noexcept;

struct ShardedPoolOptions {
  // Number of pools; 0 means one per usable CPU (crew::usable_cpus()). At
  // most kMaxShards (more: Error(invalid_options)); each shard has a worker
  // thread at least.
  static constexpr std::size_t kMaxShards = 1024;
  std::size_t shards = 0;
  Placement placement = Placement::round_robin;
  // The options of every shard; shard i is named "<pool.name>-<i>".
  PoolOptions pool{};
};

namespace detail {

class ShardBlock;

// One shard as its tasks see it. `placed` counts the tasks placed on it and
// not ended (least_loaded), plus one while the ShardedPool lives; the block
// holding the slots is freed when every slot's count has dropped to zero,
// so a task the pool abandoned can still finish its count.
struct alignas(64) ShardSlot {
  std::atomic<std::int64_t> placed{1};
  ShardBlock* block = nullptr;
};

// Drops one count of `slot`; frees the slots once all counts are gone.
void shard_unplace(ShardSlot* slot) noexcept;

// The shard whose task runs on this thread. Compared by address only, never
// read: it may belong to a ShardedPool that no longer exists.
inline thread_local const ShardSlot* t_shard = nullptr;

// What a shard runs for a task: the callable, marked with its shard while
// it runs, and (kCounted) one count of the shard's load until it ends.
template <class F, bool kCounted>
class ShardTask {
 public:
  // A counted task takes its count once the callable is stored (so a
  // throwing copy leaves none behind).
  template <class G>
  ShardTask(ShardSlot* slot, G&& f) : slot_(slot), f_(std::forward<G>(f)) {
    if constexpr (kCounted) slot_->placed.fetch_add(1, std::memory_order_relaxed);
  }
  ShardTask(ShardTask&& o) noexcept(std::is_nothrow_move_constructible_v<F>)
      : slot_(kCounted ? std::exchange(o.slot_, nullptr) : o.slot_), f_(std::move(o.f_)) {}
  ShardTask(const ShardTask&) = delete;
  ShardTask& operator=(const ShardTask&) = delete;
  ShardTask& operator=(ShardTask&&) = delete;
  ~ShardTask() {
    // Never run (refused, dropped, cancelled): the count ends here.
    if constexpr (kCounted) {
      if (slot_ != nullptr) shard_unplace(slot_);
    }
  }

  decltype(auto) operator()() requires(!is_long_task_v<F>) {
    const Running running(slot_);
    return f_();
  }
  decltype(auto) operator()(const TaskContext& ctx) requires is_long_task_v<F> {
    const Running running(slot_);
    if constexpr (std::is_invocable_v<F&, const TaskContext&>) {
      return f_(ctx);
    } else {
      return f_(ctx.stop_token);
    }
  }

 private:
  // Marks the thread for the run; a counted task's count ends with the run.
  class Running {
   public:
    explicit Running(ShardSlot*& slot) noexcept
        : slot_(slot), saved_(std::exchange(t_shard, slot)) {}
    ~Running() {
      t_shard = saved_;
      if constexpr (kCounted) shard_unplace(std::exchange(slot_, nullptr));
    }
    Running(const Running&) = delete;
    Running& operator=(const Running&) = delete;

   private:
    ShardSlot*& slot_;
    const ShardSlot* saved_;
  };

  ShardSlot* slot_;
  F f_;
};

}  // namespace detail

// Thread safety: all member functions are thread-safe. Lifetime: the
// destructor performs shutdown() with the shards' default mode and timeout;
// do not destroy a ShardedPool from one of its own tasks.
class ShardedPool : public detail::SubmitApi<ShardedPool> {
 public:
  // Throws crew::Error(Errc::invalid_options) naming the bad field.
  explicit ShardedPool(ShardedPoolOptions options);
  ~ShardedPool();

  ShardedPool(const ShardedPool&) = delete;
  ShardedPool& operator=(const ShardedPool&) = delete;
  ShardedPool(ShardedPool&&) = delete;
  ShardedPool& operator=(ShardedPool&&) = delete;

  // Submission (post, try_post, submit, try_submit, submit_wait) reads as
  // on crew::Pool (detail::SubmitApi), on the shard the placement picks. A
  // task stored inline in its queue slot may be 8 bytes smaller than on a
  // Pool (40). Under least_loaded, a task that never ran (refused,
  // cancelled, dropped) still counts as placed until its handle is
  // destroyed.

  // Shuts every shard down at once (one thread per shard) with the same
  // mode and timeout, and merges the reports: counts and task lists added
  // up, `escalated` if any shard escalated, `final_state` stopped_timeout if
  // any shard's is, `elapsed` the longest. Idempotent like Pool::shutdown.
  // Like wait_idle(), throws Error(Errc::would_deadlock) at once when called
  // from a task placed on one of the shards (it would wait for itself), and
  // in a child of fork() for a pool created before the fork (its workers
  // are not there; the destructor then returns at once, as ~Pool does).
  ShutdownReport shutdown(ShutdownMode mode, std::chrono::nanoseconds timeout);
  // With the shards' default mode and timeout.
  ShutdownReport shutdown();
  // Restarts every stopped shard; true if all of them were stopped.
  bool restart();
  void pause();
  void resume();
  // Blocks until every shard is idle or the timeout passes. Throws
  // Error(Errc::would_deadlock) from a task of a shard and in a child of
  // fork() (see shutdown()).
  bool wait_idle(std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max());

  // The shards' stats added up. `state` is the shards' common state; while
  // they differ: stopping on the way down, stopped_timeout once all stopped
  // and one timed out, running while some are paused.
  [[nodiscard]] PoolStats stats() const;
  [[nodiscard]] std::vector<PoolStats> shard_stats() const;
  [[nodiscard]] std::size_t shards() const noexcept { return pools_.size(); }
  [[nodiscard]] Pool& shard(std::size_t i) { return *pools_.at(i); }
  // Tasks placed on shard i and not ended (least_loaded only; 0 otherwise).
  [[nodiscard]] std::size_t load(std::size_t i) const noexcept;
  [[nodiscard]] Placement placement() const noexcept { return placement_; }

 private:
  friend class detail::SubmitApi<ShardedPool>;

  // SubmitApi's hook: the shard's own (see Pool::enqueue), on the shard the
  // placement picks.
  template <bool kHandle, bool kMayBlock, class F>
  decltype(auto) enqueue(F&& f, TaskOptions&& opts) {
    return place(std::forward<F>(f), [&opts](Pool& p, auto&& task) -> decltype(auto) {
      return detail::PoolAccess::enqueue<kHandle, kMayBlock>(p, std::forward<decltype(task)>(task),
                                                             std::move(opts));
    });
  }

  template <class F, class Submit>
  decltype(auto) place(F&& f, Submit&& submit) {
    using D = std::decay_t<F>;
    const std::size_t i = pick();
    detail::ShardSlot* slot = slot_at(i);
    if (placement_ == Placement::least_loaded) {
      return submit(*pools_[i], detail::ShardTask<D, true>(slot, std::forward<F>(f)));
    }
    return submit(*pools_[i], detail::ShardTask<D, false>(slot, std::forward<F>(f)));
  }

  std::size_t pick() noexcept;
  // Throws Error(would_deadlock) on a thread running a task of a shard.
  void refuse_self_wait(const char* call) const;
  detail::ShardSlot* slot_at(std::size_t i) const noexcept;

  const Placement placement_;
  std::vector<std::unique_ptr<Pool>> pools_;
  detail::ShardBlock* block_;  // the slots; outlives this object while tasks count
  alignas(64) std::atomic<std::size_t> next_{0};
};

}  // namespace crew
