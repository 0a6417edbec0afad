// bench/crew_structured.cpp: crew's layers above the pool, measured on the
// same 2-worker pool as the other crew workloads:
//
//   group_wait       crew::Group: submit kTasks short tasks, then wait();
//                    compare with short_future (a handle per task, get()).
//   funcpool_invoke  crew::FuncPool<std::uint64_t>: invoke() kTasks times,
//                    the handler doing what short_detached's task does;
//                    compare with short_detached.
//   parallel_for     crew::parallel_for over kIndicesPerTask x kTasks
//                    indices, body p[i] = i on a uint32 array; compare with
//                    oneTBB's tbb::parallel_for (impl_tbb_parallel_for.cpp)
//                    on the same body. Figures are per index.
#include <atomic>
#include <crew/batch.hpp>
#include <crew/func_pool.hpp>
#include <crew/group.hpp>
#include <crew/pool.hpp>
#include <cstdint>
#include <string_view>
#include <vector>

#include "harness.hpp"
#include "loop_data.hpp"

namespace bench {
namespace {

// Default options, kWorkers workers (like every "crew" row).
crew::PoolOptions structured_options() {
  crew::PoolOptions o;
  o.name = "bench";
  o.min_workers = kWorkers;
  o.max_workers = kWorkers;
  return o;
}

void prime_pool(crew::Pool& pool) {
  constexpr std::uint64_t kTasks = 16 * kWorkers;
  Counter done;
  for (std::uint64_t i = 0; i < kTasks; ++i) {
    if (pool.post([&done]() noexcept { done.fetch_add(1, std::memory_order_release); }) !=
        crew::Admission::accepted) {
      fail("crew refused a task");
    }
  }
  wait_for_value(done, kTasks);
}

Sample run_group_wait(std::size_t tasks) {
  crew::Pool pool(structured_options());
  prime_pool(pool);
  Counter next;
  auto task = [&next]() noexcept { next.fetch_add(1, std::memory_order_relaxed); };
  std::uint64_t succeeded = 0;
  const Sample s = timed(tasks, [&] {
    crew::Group group(pool);
    for (std::size_t i = 0; i < tasks; ++i) {
      if (group.submit(task) != crew::Admission::accepted) fail("group_wait: a task was refused");
    }
    group.wait();
    succeeded = group.stats().outcomes.succeeded;
  });
  if (next.load() != tasks || succeeded != tasks) fail("group_wait: wrong count of tasks");
  return s;
}

// Counts like short_detached's task; `n` is always 1.
struct AddToCounter {
  std::atomic<std::uint64_t>* counter;
  void operator()(std::uint64_t n) const noexcept {
    counter->fetch_add(n, std::memory_order_release);
  }
};

Sample run_funcpool_invoke(std::size_t tasks) {
  Counter done;
  crew::FuncPool<std::uint64_t> fp(structured_options(), AddToCounter{&done});
  static_assert(crew::FuncPool<std::uint64_t>::kInlineArg);
  constexpr std::uint64_t kPrime = 16 * kWorkers;
  for (std::uint64_t i = 0; i < kPrime; ++i) {
    if (fp.invoke(1) != crew::Admission::accepted) fail("crew refused a task");
  }
  wait_for_value(done, kPrime);
  return timed(tasks, [&] {
    for (std::size_t i = 0; i < tasks; ++i) {
      if (fp.invoke(1) != crew::Admission::accepted) fail("funcpool_invoke: refused");
    }
    wait_for_value(done, kPrime + tasks);
  });
}

Sample run_parallel_for(std::size_t tasks) {
  crew::Pool pool(structured_options());
  prime_pool(pool);
  LoopArray data(kIndicesPerTask * tasks);
  std::uint32_t* p = data.data();
  const Sample s = timed(data.size(), [&] {
    crew::parallel_for(pool, std::size_t{0}, data.size(),
                       [p](std::size_t i) { p[i] = static_cast<std::uint32_t>(i); });
  });
  data.check();
  return s;
}

}  // namespace

std::string_view structured_skip_reason(std::string_view impl, Workload w) {
  if (is_fork_join(w)) {
    return impl == "crew" || impl == "crew_task" || impl == "tbb_task_group"
               ? ""
               : "fork-join: crew (Group), crew_task and tbb_task_group";
  }
  if (impl == "crew_task") return "crew Task handles are measured on the fork-join workloads";
  switch (w) {
    case Workload::group_wait:
    case Workload::funcpool_invoke:
      return impl == "crew" ? "" : "a crew feature (crew::Group, crew::FuncPool)";
    case Workload::three_pools:
    case Workload::one_pool:
      return impl == "crew" ? "" : "crew only (several pools in one process)";
    case Workload::queue_deadline:
      return impl == "crew"             ? ""
             : impl.starts_with("crew") ? "the queue deadline's cost is measured on impl crew"
                                        : "a crew feature (TaskOptions::queue_timeout)";
    case Workload::parallel_for:
      return impl == "crew" || impl == "tbb_parallel_for" ? ""
                                                          : "compared with tbb::parallel_for only";
    case Workload::long_deadline:
      return impl == "crew_unbounded" ? "the unbounded queue is measured on the four flat workloads"
             : impl == "tbb_parallel_for" ? "tbb::parallel_for runs loops, not tasks"
                                          : "";
    default:
      return impl == "tbb_parallel_for" ? "tbb::parallel_for runs loops, not tasks" : "";
  }
}

Sample run_crew_structured(Workload w, std::size_t tasks) {
  switch (w) {
    case Workload::group_wait:
      return run_group_wait(tasks);
    case Workload::funcpool_invoke:
      return run_funcpool_invoke(tasks);
    case Workload::parallel_for:
      return run_parallel_for(tasks);
    default:
      fail("not a structured workload");
  }
}

}  // namespace bench
