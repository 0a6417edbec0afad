// bench/crew_forkjoin.cpp: crew on the fork-join workloads (forkjoin.hpp),
// two ways, each on a fresh pool of kWorkers workers with default options
// otherwise (a bounded queue):
//
//   crew       a crew::Group per inner node: children submitted into it,
//              then wait() (what docs/api.md recommends for recursion: a
//              wait from a task of the pool runs queued tasks of the pool).
//   crew_task  Task handles: pool.submit() per child, then get() on each
//              (called from a worker, get() runs the awaited task itself
//              while it is still queued).
//
// Each measurement runs in a child process (isolate.hpp) unless
// fork_join_config().isolate is off: a worker that overflows its stack
// then shows as "SIGSEGV" in its row instead of ending the benchmark.
#include <array>
#include <crew/group.hpp>
#include <crew/pool.hpp>
#include <crew/task.hpp>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string_view>
#include <thread>
#include <utility>

#include "forkjoin.hpp"
#include "harness.hpp"
#include "isolate.hpp"

namespace bench {
namespace {

crew::PoolOptions fork_join_options() {
  const ForkJoinConfig& c = fork_join_config();
  crew::PoolOptions o;
  o.name = "bench";
  o.min_workers = c.crew_workers;
  o.max_workers = c.crew_workers;
  if (c.crew_unbounded) o.queue_capacity = crew::kUnbounded;
  return o;
}

struct CrewGroupRuntime {
  crew::Pool pool{fork_join_options()};

  class Scope {
   public:
    explicit Scope(CrewGroupRuntime& rt) : group_(rt.pool) {}
    template <class F>
    void spawn(F&& f) {
      if (group_.submit(std::forward<F>(f)) != crew::Admission::accepted) {
        fail("crew: a fork-join task was refused");
      }
    }
    void wait() { group_.wait(); }

   private:
    crew::Group group_;
  };

  template <class F>
  void run_root(F&& f) {
    Scope scope(*this);
    scope.spawn(std::forward<F>(f));
    scope.wait();
  }
};

struct CrewTaskRuntime {
  crew::Pool pool{fork_join_options()};

  class Scope {
   public:
    explicit Scope(CrewTaskRuntime& rt) : pool_(rt.pool) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() { destroy_handles(); }  // only if wait() threw
    template <class F>
    void spawn(F&& f) {
      if (n_ == kMaxFanout) fail("crew_task: more children than kMaxFanout");
      new (&handles_[n_]) crew::Task<void>(pool_.submit(std::forward<F>(f)));
      ++n_;
    }
    // get() rethrows a child's exception or throws for a refused child.
    void wait() {
      for (std::size_t i = 0; i < n_; ++i) handle(i).get();
      destroy_handles();
    }

   private:
    // Handles are constructed as children are spawned, as a recursion
    // written with local Task variables has them: a default-constructed
    // array of kMaxFanout handles per node cost fib about 6 % of its time
    // in zeroing alone (perf).
    crew::Task<void>& handle(std::size_t i) {
      return *std::launder(reinterpret_cast<crew::Task<void>*>(&handles_[i]));
    }
    void destroy_handles() noexcept {
      for (std::size_t i = 0; i < n_; ++i) handle(i).~Task();
      n_ = 0;
    }

    crew::Pool& pool_;
    struct alignas(crew::Task<void>) Storage {
      std::byte bytes[sizeof(crew::Task<void>)];
    };
    std::array<Storage, kMaxFanout> handles_;
    std::size_t n_ = 0;
  };

  template <class F>
  void run_root(F&& f) {
    pool.submit(std::forward<F>(f)).get();
  }
};

template <class R>
Sample run_crew(Workload w) {
  auto measure = [w] {
    R rt;
    return measure_fork_join(rt, w);
  };
  const ForkJoinConfig& c = fork_join_config();
  return c.isolate ? run_isolated(c.timeout_seconds, measure) : measure();
}

class CrewTaskImpl final : public Impl {
 public:
  [[nodiscard]] std::string_view name() const override { return "crew_task"; }
  [[nodiscard]] std::string_view skip_reason(Workload w) const override {
    return structured_skip_reason(name(), w);
  }
  [[nodiscard]] std::string_view alloc_note() const override { return kCrewAllocNote; }
  Sample run(Workload w, std::size_t /*tasks*/) override {
    if (!is_fork_join(w)) fail("crew_task runs the fork-join workloads only");
    return run_crew<CrewTaskRuntime>(w);
  }
  // Tasks that sleep long enough for every worker of the pool to take some.
  std::size_t executing_threads() override {
    constexpr std::uint64_t kTasks = 20 * kWorkers;
    CrewTaskRuntime rt;
    std::mutex mu;
    std::set<std::thread::id> seen;
    Counter done;
    for (std::uint64_t i = 0; i < kTasks; ++i) {
      const crew::Admission a = rt.pool.post([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        {
          const std::lock_guard lock(mu);
          seen.insert(std::this_thread::get_id());
        }
        done.fetch_add(1, std::memory_order_release);
      });
      if (a != crew::Admission::accepted) fail("crew refused a task");
    }
    wait_for_value(done, kTasks);
    const std::lock_guard lock(mu);
    return seen.size();
  }
};

}  // namespace

Sample run_crew_fork_join(Workload w) { return run_crew<CrewGroupRuntime>(w); }
Sample run_crew_task_fork_join(Workload w) { return run_crew<CrewTaskRuntime>(w); }

std::unique_ptr<Impl> make_crew_task_impl() { return std::make_unique<CrewTaskImpl>(); }

}  // namespace bench
