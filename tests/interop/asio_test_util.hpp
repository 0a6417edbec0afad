// tests/interop/asio_test_util.hpp: what the crew::asio tests share.
#pragma once

#include <chrono>
#include <thread>

#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew::test {

using namespace std::chrono_literals;

// Shuts `pool` down soft while its worker is held: the queued tasks are
// dropped, then the worker is released so that the shutdown can finish.
inline ShutdownReport shut_down_soft_while_held(Pool& pool, WorkerHold& hold) {
  ShutdownReport report;
  std::thread stopper([&] { report = pool.shutdown(ShutdownMode::soft, 5s); });
  std::this_thread::sleep_for(30ms);  // the queue is dropped at once; the shutdown waits
  hold.release();
  stopper.join();
  return report;
}

}  // namespace crew::test
