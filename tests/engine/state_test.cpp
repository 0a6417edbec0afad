// Tests of the pool's and workers' state machines: the legal edges are the
// documented ones, and a pool and its workers can be driven through every
// one of them (observed through Observer::on_pool_state / on_worker_state).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <mutex>
#include <set>
#include <stop_token>
#include <thread>
#include <utility>

#include "crew/observer.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Gate;
using test::Watchdog;

template <class S>
std::set<std::pair<S, S>> legal_edges(std::initializer_list<S> all) {
  std::set<std::pair<S, S>> edges;
  for (S from : all) {
    for (S to : all) {
      if (from != to && is_legal_transition(from, to)) edges.insert({from, to});
    }
  }
  return edges;
}

constexpr auto kPoolStates = {PoolState::created,  PoolState::running, PoolState::paused,
                              PoolState::stopping, PoolState::stopped, PoolState::stopped_timeout};
constexpr auto kWorkerStates = {WorkerState::starting, WorkerState::idle,
                                WorkerState::busy,     WorkerState::stopping,
                                WorkerState::stopped,  WorkerState::abandoned};

class Recorder final : public Observer {
 public:
  std::uint32_t events() const noexcept override { return pool_state | worker_state; }
  void on_pool_state(std::string_view, PoolState from, PoolState to) noexcept override {
    const std::lock_guard lock(mu_);
    pool_.insert({from, to});
  }
  void on_worker_state(std::string_view, std::uint64_t, WorkerState from,
                       WorkerState to) noexcept override {
    const std::lock_guard lock(mu_);
    worker_.insert({from, to});
  }
  std::set<std::pair<PoolState, PoolState>> pool_edges() {
    const std::lock_guard lock(mu_);
    return pool_;
  }
  std::set<std::pair<WorkerState, WorkerState>> worker_edges() {
    const std::lock_guard lock(mu_);
    return worker_;
  }

 private:
  std::mutex mu_;
  std::set<std::pair<PoolState, PoolState>> pool_;
  std::set<std::pair<WorkerState, WorkerState>> worker_;
};

TEST(StateTables, PoolEdgesAreTheDocumentedOnes) {
  const auto edges = legal_edges(kPoolStates);
  using S = PoolState;
  const std::set<std::pair<S, S>> expected = {
      {S::created, S::running},          {S::running, S::paused},
      {S::paused, S::running},           {S::running, S::stopping},
      {S::paused, S::stopping},          {S::stopping, S::stopped},
      {S::stopping, S::stopped_timeout}, {S::stopped, S::running},
      {S::stopped_timeout, S::running}};
  EXPECT_EQ(edges, expected);
  for (S s : kPoolStates) EXPECT_FALSE(to_string(s).empty());
}

TEST(StateTables, WorkerEdgesAreTheDocumentedOnes) {
  const auto edges = legal_edges(kWorkerStates);
  using S = WorkerState;
  const std::set<std::pair<S, S>> expected = {
      {S::starting, S::idle},     {S::starting, S::stopping}, {S::starting, S::abandoned},
      {S::idle, S::busy},         {S::busy, S::idle},         {S::idle, S::stopping},
      {S::busy, S::stopping},     {S::busy, S::abandoned},    {S::stopping, S::stopped},
      {S::stopping, S::abandoned}};
  EXPECT_EQ(edges, expected);
  for (S s : kWorkerStates) EXPECT_FALSE(to_string(s).empty());
}

TEST(StateWalk, APoolGoesThroughEveryLegalEdge) {
  Watchdog dog;
  auto rec = std::make_shared<Recorder>();
  Pool pool({.max_workers = 1, .observers = {rec}});  // created -> running
  pool.pause();                                       // running -> paused
  pool.resume();                                      // paused -> running
  (void)pool.shutdown(ShutdownMode::drain, 0s);       // running -> stopping -> stopped
  ASSERT_TRUE(pool.restart());                        // stopped -> running
  pool.pause();
  (void)pool.shutdown(ShutdownMode::soft, 0s);  // paused -> stopping -> stopped
  ASSERT_TRUE(pool.restart());
  std::latch started(1);
  auto stuck = pool.submit([&](std::stop_token stop) {
    started.count_down();
    while (!stop.stop_requested()) std::this_thread::sleep_for(100us);
  });
  started.wait();
  (void)pool.shutdown(ShutdownMode::drain, 10ms);  // stopping -> stopped_timeout
  EXPECT_EQ(pool.state(), PoolState::stopped_timeout);
  ASSERT_TRUE(pool.restart());  // stopped_timeout -> running
  EXPECT_EQ(rec->pool_edges(), legal_edges(kPoolStates));
}

TEST(StateWalk, WorkersGoThroughEveryLegalEdge) {
  Watchdog dog;
  auto rec = std::make_shared<Recorder>();
  {
    // starting -> idle -> busy -> idle -> stopping -> stopped (drain while idle),
    // busy -> stopping (a graceful stop while it works).
    Pool pool({.max_workers = 1, .observers = {rec}});
    EXPECT_EQ(pool.submit([] { return 1; }).get(), 1);
    ASSERT_TRUE(eventually([&] { return pool.stats().idle == 1; }));
    std::latch started(1);
    Gate gate;
    auto t = pool.submit([&] {
      started.count_down();
      gate.wait();
    });
    started.wait();
    ASSERT_TRUE(pool.stop_worker(pool.workers().at(0).id, WorkerStop::graceful));
    gate.open();
    t.wait();
    EXPECT_EQ(pool.submit([] { return 2; }).get(), 2);
    ASSERT_TRUE(eventually([&] { return pool.stats().idle == 1; }));
  }
  {
    // starting -> stopping (a start hook that throws).
    std::atomic<int> starts{0};
    Pool pool({.min_workers = 1,
               .max_workers = 1,
               .on_exception = [](const TaskRef&, std::exception_ptr) {},
               .on_worker_start =
                   [&](std::uint64_t) {
                     if (starts.fetch_add(1) == 0) throw std::runtime_error("no");
                   },
               .observers = {rec}});
    ASSERT_TRUE(eventually([&] { return pool.stats().workers_replaced == 1; }));
  }
  {
    // busy -> abandoned (a task that ignores its deadline).
    auto gate = std::make_shared<Gate>();
    Pool pool({.max_workers = 1, .abandon_grace = 10ms, .observers = {rec}});
    auto hung = pool.submit([gate](std::stop_token) { gate->wait(); }, {.timeout = 5ms});
    ASSERT_TRUE(eventually([&] { return pool.stats().abandoned == 1; }));
    gate->open();
  }
  {
    // stopping -> abandoned (a stop hook that hangs through a hard shutdown).
    auto gate = std::make_shared<Gate>();
    Pool pool({.min_workers = 1,
               .max_workers = 1,
               .abandon_grace = 10ms,
               .on_worker_stop = [gate](std::uint64_t) { gate->wait(); },
               .observers = {rec}});
    ASSERT_TRUE(eventually([&] { return pool.stats().idle == 1; }));
    (void)pool.shutdown(ShutdownMode::hard, 0s);
    gate->open();
  }
  {
    // starting -> abandoned (a start hook that hangs through a hard shutdown).
    auto gate = std::make_shared<Gate>();
    Pool pool({.min_workers = 1,
               .max_workers = 1,
               .abandon_grace = 10ms,
               .on_worker_start = [gate](std::uint64_t) { gate->wait(); },
               .observers = {rec}});
    (void)pool.shutdown(ShutdownMode::hard, 0s);
    gate->open();
  }
  std::this_thread::sleep_for(20ms);  // written-off threads finish on their own
  EXPECT_EQ(rec->worker_edges(), legal_edges(kWorkerStates));
}

}  // namespace
}  // namespace crew
