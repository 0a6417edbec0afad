// Tests of the pool's and workers' state machines: the legal edges are the
// documented ones, and a pool and its workers can be driven through every
// one of them (observed through Observer::on_pool_state / on_worker_state).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <latch>
#include <map>
#include <mutex>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

// Each worker's state changes, as observers heard them, keyed by pool name
// and worker id, in the order they arrived (which need not be the order in
// which they happened: events are emitted after the change, on different
// threads).
class ChainRecorder final : public Observer {
 public:
  using Edge = std::pair<WorkerState, WorkerState>;
  std::uint32_t events() const noexcept override { return worker_state; }
  void on_worker_state(std::string_view pool, std::uint64_t worker, WorkerState from,
                       WorkerState to) noexcept override {
    const std::lock_guard lock(mu_);
    chains_[{std::string(pool), worker}].push_back({from, to});
  }
  std::map<std::pair<std::string, std::uint64_t>, std::vector<Edge>> chains() {
    const std::lock_guard lock(mu_);
    return chains_;
  }

 private:
  std::mutex mu_;
  std::map<std::pair<std::string, std::uint64_t>, std::vector<Edge>> chains_;
};

// Whether a worker's edges, in any order, make one walk from `starting`:
// each state is left as often as it is entered, except `starting` (left once
// more) and the last state (entered once more), and nothing leaves
// `abandoned`. A state overwritten without being read (a write-off's
// `abandoned` lost to the worker's own store, say) shows up as two edges
// leaving the same state: a fork, which no single walk has.
bool one_walk(const std::vector<ChainRecorder::Edge>& edges) {
  std::map<WorkerState, int> balance;  // times left minus times entered
  for (const auto& [from, to] : edges) {
    if (from == WorkerState::abandoned) return false;
    ++balance[from];
    --balance[to];
  }
  int starts = 0;
  int ends = 0;
  for (const auto& [state, b] : balance) {
    if (b == 1 && state == WorkerState::starting) {
      ++starts;
    } else if (b == -1) {
      ++ends;
    } else if (b != 0) {
      return false;
    }
  }
  return edges.empty() || (starts == 1 && ends == 1);
}

TEST(StateWalk, TheChainCheckerSeesAFork) {
  using S = WorkerState;
  EXPECT_TRUE(one_walk({{S::starting, S::idle}, {S::idle, S::busy}, {S::busy, S::abandoned}}));
  EXPECT_TRUE(one_walk({{S::idle, S::busy},
                        {S::starting, S::idle},
                        {S::busy, S::idle},
                        {S::idle, S::busy},
                        {S::busy, S::abandoned}}));
  // The worker read `busy`, a write-off stored `abandoned`, then the worker
  // stored `idle` over it.
  EXPECT_FALSE(one_walk(
      {{S::starting, S::idle}, {S::idle, S::busy}, {S::busy, S::abandoned}, {S::busy, S::idle}}));
  EXPECT_FALSE(one_walk({{S::starting, S::idle}, {S::abandoned, S::idle}}));
}

// A hard shutdown with a 1 ms grace writes off workers while they flip
// between busy and idle: every worker's state changes still make one walk,
// and none follows its write-off.
TEST(StateWalk, AWriteOffRacingAWorkersOwnStateChangeIsNeverLost) {
  Watchdog dog(60s);
  auto rec = std::make_shared<ChainRecorder>();
  constexpr int kRounds = 150;
  for (int round = 0; round < kRounds; ++round) {
    Pool pool({.name = "r" + std::to_string(round),
               .max_workers = 2,
               .abandon_grace = 1ms,
               .observers = {rec}});
    std::atomic<bool> stop{false};
    std::thread poster([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        const auto a = pool.try_post([] {
          const auto until = std::chrono::steady_clock::now() + 20us;
          while (std::chrono::steady_clock::now() < until) {
          }
        });
        if (a == Admission::closed) break;
      }
    });
    std::this_thread::sleep_for(2ms);
    (void)pool.shutdown(ShutdownMode::hard, 0s);
    stop = true;
    poster.join();
  }
  std::this_thread::sleep_for(50ms * test::kSlowdown);  // written-off threads end their tasks
  const auto chains = rec->chains();
  ASSERT_FALSE(chains.empty());
  int written_off = 0;
  for (const auto& [key, edges] : chains) {
    EXPECT_TRUE(one_walk(edges)) << "pool " << key.first << " worker " << key.second;
    for (const auto& edge : edges) written_off += edge.second == WorkerState::abandoned ? 1 : 0;
  }
  std::printf("%d workers written off in %d shutdowns\n", written_off, kRounds);
}

}  // namespace
}  // namespace crew
