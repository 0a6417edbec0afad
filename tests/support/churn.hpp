// tests/support/churn.hpp: a thread that keeps a pool busy with trivial
// tasks, for tests that read the pool's counters while outcomes change
// (pool_test's stats snapshots, pool_workers_test's wait_idle).
#pragma once

#include <atomic>
#include <thread>

#include "crew/pool.hpp"

namespace crew::test {

// Submits trivial tasks one at a time until stopped: outcomes keep being
// counted while another thread reads stats().
class Churn {
 public:
  explicit Churn(Pool& pool)
      : thread_([this, &pool] {
          while (!stop_.load()) pool.submit([] {}).wait();
        }) {}
  Churn(const Churn&) = delete;
  Churn& operator=(const Churn&) = delete;
  ~Churn() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace crew::test
