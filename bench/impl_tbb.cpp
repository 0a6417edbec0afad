// bench/impl_tbb.cpp: oneTBB, two ways.
//
// tbb_enqueue:    tbb::task_arena::enqueue, TBB's fire-and-forget submission
//                 from a thread outside the arena; the closest match to a
//                 pool's post().
// tbb_task_group: tbb::task_group::run inside task_arena::execute, ending in
//                 task_group::wait, during which the producer runs tasks
//                 too. This is TBB's best case for one producer; it has no
//                 per-task handle and no multi-producer arena entry, hence the
//                 skips. On the fork-join workloads (forkjoin.hpp): a
//                 task_group per inner node, run() per child, then wait(),
//                 inside a task_arena of kWorkers slots (one TBB worker and
//                 the main thread, which enters it with execute()).
#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <future>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>

#include "forkjoin.hpp"
#include "harness.hpp"

namespace bench {
namespace {

constexpr std::string_view kTbbAllocNote =
    "TBB takes task objects from its own per-thread pools, refilled from libtbbmalloc, "
    "which bypasses malloc; only malloc/new calls are counted";

// TBB's global worker pool holds hardware_concurrency - 1 threads by default,
// i.e. 1 here. Allowing 3 (2 workers + 1 external thread) lets an arena
// really get 2 workers. Lives until exit.
void allow_two_tbb_workers() {
  static const tbb::global_control control(tbb::global_control::max_allowed_parallelism,
                                           kWorkers + 1);
}

// task_arena::enqueue calls its functor as const (so std::packaged_task does
// not fit); mutable members give the same thing: one promise per task.
template <class F>
struct PromiseTask {
  mutable F f;
  mutable std::promise<std::invoke_result_t<F&>> promise;
  void operator()() const {
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
      f();
      promise.set_value();
    } else {
      promise.set_value(f());
    }
  }
};

struct TbbEnqueue {
  static constexpr std::string_view kName = "tbb_enqueue";
  static constexpr std::string_view kAllocNote = kTbbAllocNote;
  static constexpr bool kLatency = true;

  // No slot reserved for an external thread: both slots are for workers.
  tbb::task_arena arena{static_cast<int>(kWorkers), /*reserved_for_masters=*/0};

  TbbEnqueue() {
    allow_two_tbb_workers();
    arena.initialize();
  }

  template <class F>
  void post(F&& f) {
    arena.enqueue(std::forward<F>(f));
  }
  template <class F>
  auto submit(F&& f) {
    PromiseTask<std::decay_t<F>> task{std::forward<F>(f), {}};
    auto future = task.promise.get_future();
    arena.enqueue(std::move(task));
    return future;
  }
  template <class Fn>
  void produce(Fn&& fn) {
    fn();
  }
  static std::string_view skip_reason(Workload w) {
    return w == Workload::long_deadline ? "a crew feature (tasks with a deadline and a stop token)"
                                        : "";
  }
};

// The fork-join runtime of forkjoin.hpp. The arena has kWorkers slots, one
// of them reserved for the thread that calls execute(): the same number of
// threads running tasks as crew's kWorkers workers.
struct TbbForkJoin {
  tbb::task_arena arena{static_cast<int>(kWorkers), /*reserved_for_masters=*/1};

  TbbForkJoin() {
    allow_two_tbb_workers();
    arena.initialize();
  }

  class Scope {
   public:
    explicit Scope(TbbForkJoin& /*rt*/) {}
    template <class F>
    void spawn(F&& f) {
      group_.run(std::forward<F>(f));
    }
    void wait() { group_.wait(); }

   private:
    tbb::task_group group_;
  };

  template <class F>
  void run_root(F&& f) {
    arena.execute([&] {
      Scope scope(*this);
      scope.spawn(std::forward<F>(f));
      scope.wait();
    });
  }
};

struct TbbTaskGroup {
  static constexpr std::string_view kName = "tbb_task_group";
  static constexpr std::string_view kAllocNote = kTbbAllocNote;

  // kWorkers worker slots plus the producer's slot, which it uses to run
  // tasks while it waits.
  tbb::task_arena arena{static_cast<int>(kWorkers) + 1, /*reserved_for_masters=*/1};
  tbb::task_group group;

  TbbTaskGroup() {
    allow_two_tbb_workers();
    arena.initialize();
  }

  template <class F>
  void post(F&& f) {
    group.run(std::forward<F>(f));
  }
  template <class Fn>
  void produce(Fn&& fn) {
    arena.execute([&] {
      fn();
      group.wait();
    });
  }
  static Sample run_fork_join(Workload w) {
    TbbForkJoin rt;
    return measure_fork_join(rt, w);
  }
  static std::string_view skip_reason(Workload w) {
    switch (w) {
      case Workload::short_future:
        return "no per-task handle; task_group::wait waits for all tasks";
      case Workload::producers_4:
        return "one arena slot for external threads; 3 of 4 producers would have execute() "
               "delegated";
      case Workload::long_deadline:
        return "a crew feature (tasks with a deadline and a stop token)";
      default:
        return "";
    }
  }
};

}  // namespace

std::unique_ptr<Impl> make_tbb_enqueue_impl() {
  return std::make_unique<AdapterImpl<TbbEnqueue>>();
}
std::unique_ptr<Impl> make_tbb_task_group_impl() {
  return std::make_unique<AdapterImpl<TbbTaskGroup>>();
}

}  // namespace bench
