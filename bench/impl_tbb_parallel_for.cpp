// bench/impl_tbb_parallel_for.cpp: oneTBB's tbb::parallel_for, the reference
// for crew::parallel_for (workload parallel_for only).
//
// Called from the benchmark's main thread with TBB's defaults: the implicit
// arena (the caller plus hardware_concurrency - 1 workers, 2 threads here,
// as many as crew::parallel_for uses by default), auto_partitioner, and the
// body's loop over a blocked_range compiled with it: TBB's fastest form.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>

#include "harness.hpp"
#include "loop_data.hpp"

namespace bench {
namespace {

class TbbParallelFor final : public Impl {
 public:
  [[nodiscard]] std::string_view name() const override { return "tbb_parallel_for"; }
  [[nodiscard]] std::string_view skip_reason(Workload w) const override {
    return structured_skip_reason(name(), w);
  }
  [[nodiscard]] std::string_view alloc_note() const override {
    return "TBB takes task objects from its own per-thread pools, refilled from libtbbmalloc, "
           "which bypasses malloc; only malloc/new calls are counted";
  }

  Sample run(Workload w, std::size_t tasks) override {
    if (w != Workload::parallel_for) fail("tbb_parallel_for runs the parallel_for workload only");
    LoopArray data(kIndicesPerTask * tasks);
    std::uint32_t* p = data.data();
    const Sample s = timed(data.size(), [&] {
      oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::size_t>(0, data.size()),
                                [p](const oneapi::tbb::blocked_range<std::size_t>& r) {
                                  for (std::size_t i = r.begin(); i != r.end(); ++i) {
                                    p[i] = static_cast<std::uint32_t>(i);
                                  }
                                });
    });
    data.check();
    return s;
  }

  // Blocks that sleep long enough for every thread of the arena to take some.
  std::size_t executing_threads() override {
    std::mutex mu;
    std::set<std::thread::id> seen;
    oneapi::tbb::parallel_for(std::size_t{0}, std::size_t{40}, [&](std::size_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const std::lock_guard lock(mu);
      seen.insert(std::this_thread::get_id());
    });
    return seen.size();
  }
};

}  // namespace

std::unique_ptr<Impl> make_tbb_parallel_for_impl() { return std::make_unique<TbbParallelFor>(); }

}  // namespace bench
