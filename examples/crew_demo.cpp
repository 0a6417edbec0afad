// crew_demo: a pool on a small mixed workload, printing what happened.
//
//   crew_demo [--tasks N]
//
// Posts N short tasks, submits a few with results (one of which throws),
// runs long tasks with deadlines (one cooperative task that times out, one
// cancelled through its handle), then shuts the pool down softly with work
// still queued and prints the report.
#include <atomic>
#include <chrono>
#include <crew/pool.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

std::uint64_t factorial(std::uint64_t n) {
  std::uint64_t r = 1;
  for (std::uint64_t k = 2; k <= n; ++k) r *= k;
  return r;
}

void print_counts(const char* label, const crew::OutcomeCounts& c) {
  std::printf(
      "%-10s succeeded %llu, failed %llu, cancelled %llu, timed out %llu, rejected %llu\n", label,
      static_cast<unsigned long long>(c.succeeded), static_cast<unsigned long long>(c.failed),
      static_cast<unsigned long long>(c.cancelled), static_cast<unsigned long long>(c.timed_out),
      static_cast<unsigned long long>(c.rejected));
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t tasks = 1'000'000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tasks") == 0 && i + 1 < argc) {
      tasks = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: crew_demo [--tasks N]\n");
      return 2;
    }
  }

  crew::Pool pool({.name = "demo", .task_timeout = 2s, .abandon_grace = 500ms});
  std::printf("pool '%s': up to %zu workers, queue of %zu\n", std::string(pool.name()).c_str(),
              pool.options().max_workers, pool.options().queue_capacity);

  // 1. Fire-and-forget short tasks.
  std::atomic<std::uint64_t> sum{0};
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < tasks; ++i) {
    if (pool.post([&sum] { sum.fetch_add(1, std::memory_order_relaxed); }) !=
        crew::Admission::accepted) {
      std::fprintf(stderr, "post refused\n");
      return 1;
    }
  }
  (void)pool.wait_idle(60s);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("posted %zu short tasks: %llu ran in %.3f s (%.0f ns/task)\n", tasks,
              static_cast<unsigned long long>(sum.load()), secs,
              secs * 1e9 / static_cast<double>(tasks));

  // 2. Tasks with results; one throws.
  std::vector<crew::Task<std::uint64_t>> results;
  for (std::uint64_t n = 15; n <= 20; ++n)
    results.push_back(pool.submit([n] { return factorial(n); }));
  auto bad = pool.submit([]() -> std::uint64_t { throw std::runtime_error("no such input"); });
  for (auto& r : results)
    std::printf("factorial -> %llu\n", static_cast<unsigned long long>(r.get()));
  try {
    (void)bad.get();
  } catch (const std::exception& e) {
    std::printf("task #%llu failed: %s\n", static_cast<unsigned long long>(bad.id()), e.what());
  }

  // 3. Long tasks: one runs past its deadline, one is cancelled.
  auto slow = pool.submit(
      [](std::stop_token stop) {
        while (!stop.stop_requested()) std::this_thread::sleep_for(1ms);
        return 0;
      },
      {.name = "slow-report", .timeout = 50ms});
  auto cancelled = pool.submit(
      [](const crew::TaskContext& ctx) {
        while (!ctx.stop_requested()) std::this_thread::sleep_for(1ms);
      },
      {.name = "user-export"});
  std::this_thread::sleep_for(20ms);
  std::printf("cancel '%s': %s\n", std::string(cancelled.name()).c_str(),
              std::string(crew::to_string(cancelled.cancel())).c_str());
  slow.wait();
  cancelled.wait();
  std::printf("'%s' ended %s, '%s' ended %s\n", std::string(slow.name()).c_str(),
              std::string(crew::to_string(slow.status())).c_str(),
              std::string(cancelled.name()).c_str(),
              std::string(crew::to_string(cancelled.status())).c_str());

  // 4. A soft shutdown with work still queued: queued tasks are rejected and
  // listed, the running ones finish.
  pool.pause();
  for (int i = 0; i < 5; ++i) {
    (void)pool.post([] { std::this_thread::sleep_for(1ms); },
                    {.name = "batch-" + std::to_string(i)});
  }
  const crew::ShutdownReport report = pool.shutdown(crew::ShutdownMode::soft, 1s);
  std::printf("shutdown %s -> %s in %.1f ms\n", std::string(crew::to_string(report.mode)).c_str(),
              std::string(crew::to_string(report.final_state)).c_str(),
              std::chrono::duration<double, std::milli>(report.elapsed).count());
  print_counts("during:", report.during);
  print_counts("lifetime:", report.lifetime);
  std::printf("rejected by the shutdown:");
  for (const crew::TaskRef& t : report.rejected) std::printf(" %s", t.name.c_str());
  std::printf("\n");
  return 0;
}
