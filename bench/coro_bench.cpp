// bench/coro_bench.cpp: coroutine tasks (crew/coro.hpp), the figures of
// docs/bench/coroutines.md.
//
//   sleepers     100,000 coroutine tasks each sleeping 1 s on a 2-worker
//                pool: seconds from the first spawn until all ended, and
//                the peak RSS above the idle pool (VmHWM - VmRSS before)
//   fib          fib(30), one task per call: a coroutine task per call
//                (spawn + co_await), forked children of one coroutine task
//                (crew::fork + join), crew::Group and oneTBB task_group,
//                2 threads each
//   skynet       skynet(6): 10 calls per call, 10^6 leaves; the same four
//   nqueens      nqueens(11): one call per queen placed; the same four
//   matmul       matmul(1024): C += A * B in doubles, quadrants split down
//                to 64 x 64, 8 calls per split; the same four
//   latency      resume latency (p50, p99, us): a plain post hand-off from
//                a foreign thread, a coroutine's lateness after
//                sleep_until, and a coroutine resumed by the end of the
//                coroutine task it awaits
//   cancel       10,000 suspended coroutine tasks cancelled through their
//                handles: ms from the first cancel until all ended (and
//                until the last cancel() returned)
//   deadline     200 coroutine tasks with a 100 ms timeout sleeping 10 s:
//                p99 ms from spawn to the end of the sleep
//
// Each round runs every workload once, in turn, each in a child process
// (fork, so that RSS and the pools start fresh); the figures are medians
// over the rounds.
//
//   crew_coro_bench [--rounds N] [--only NAME]
#include <sys/wait.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "crew/coro.hpp"
#include "crew/group.hpp"
#include "crew/pool.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

crew::PoolOptions two_workers(const char* name) {
  crew::PoolOptions o;
  o.name = name;
  o.min_workers = 2;
  o.max_workers = 2;
  o.queue_capacity = 1 << 20;
  return o;
}

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

long status_kib(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::size_t n = std::strlen(field);
  while (std::getline(f, line)) {
    if (line.compare(0, n, field) == 0) return std::strtol(line.c_str() + n + 1, nullptr, 10);
  }
  return -1;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  return v[i];
}

using Result = std::map<std::string, double>;

// ---- sleepers ----
crew::Co<void> sleep_one(std::atomic<int>* left) {
  co_await crew::sleep_for(1s);
  left->fetch_sub(1, std::memory_order_relaxed);
}

Result sleepers() {
  constexpr int kN = 100'000;
  crew::Pool pool(two_workers("sleepers"));
  std::this_thread::sleep_for(50ms);
  const long idle_kib = status_kib("VmRSS:");
  std::atomic<int> left{kN};
  const auto t0 = Clock::now();
  for (int i = 0; i < kN; ++i) (void)crew::spawn_detached(pool, sleep_one(&left));
  const double spawned = secs(Clock::now() - t0);
  while (left.load() != 0) std::this_thread::sleep_for(1ms);
  const double done = secs(Clock::now() - t0);
  const long peak_kib = status_kib("VmHWM:");
  return {{"spawn_s", spawned},
          {"all_done_s", done},
          {"peak_rss_above_idle_mib", static_cast<double>(peak_kib - idle_kib) / 1024.0}};
}

// ---- fork-join: one task per call, three ways ----
// fib(n): two calls per call.
crew::Co<long> fib_co(crew::Pool& pool, int n) {
  if (n < 2) co_return n;
  crew::Task<long> a = crew::spawn(pool, fib_co(pool, n - 1));
  const long b = co_await fib_co(pool, n - 2);
  co_return b + co_await a;
}

// The same as forked children (crew::fork): one coroutine task in all.
crew::Co<long> fib_fork_node(int n) {
  if (n < 2) co_return n;
  crew::Forked<long> a = crew::fork(fib_fork_node(n - 1));
  const long b = co_await fib_fork_node(n - 2);
  co_return b + co_await a;
}
crew::Co<long> fib_fork(crew::Pool& /*pool*/, int n) { co_return co_await fib_fork_node(n); }

long fib_group(crew::Pool& pool, int n) {
  if (n < 2) return n;
  long a = 0;
  crew::Group g(pool);
  (void)g.submit([&pool, &a, n] { a = fib_group(pool, n - 1); });
  const long b = fib_group(pool, n - 2);
  g.wait();
  return a + b;
}

long fib_tbb(int n) {
  if (n < 2) return n;
  long a = 0;
  tbb::task_group g;
  g.run([&a, n] { a = fib_tbb(n - 1); });
  const long b = fib_tbb(n - 2);
  g.wait();
  return a + b;
}

// skynet(depth): 10 calls per call down to 10^depth leaves, each returning
// its number; the root returns their sum.
constexpr int kSkynetFan = 10;

long pow10(int depth) {
  long n = 1;
  for (int i = 0; i < depth; ++i) n *= kSkynetFan;
  return n;
}

crew::Co<long> skynet_node(crew::Pool& pool, long num, long size) {
  if (size == 1) co_return num;
  std::vector<crew::Task<long>> kids;
  kids.reserve(kSkynetFan);
  const long step = size / kSkynetFan;
  for (int i = 0; i < kSkynetFan; ++i) {
    kids.push_back(crew::spawn(pool, skynet_node(pool, num + i * step, step)));
  }
  long sum = 0;
  for (crew::Task<long>& k : kids) sum += co_await k;
  co_return sum;
}
crew::Co<long> skynet_co(crew::Pool& pool, int depth) {
  co_return co_await skynet_node(pool, 0, pow10(depth));
}

// Joined newest first: each join then finds its child's step on top of the
// worker's queue and takes it back without a read-modify-write (joined in
// fork order, skynet took 1.17-1.36x Group's time instead of 0.73-0.97x,
// docs/bench/coroutines.md).
crew::Co<long> skynet_fork_node(long num, long size) {
  if (size == 1) co_return num;
  std::array<crew::Forked<long>, kSkynetFan> kids;  // as the Group version's array
  const long step = size / kSkynetFan;
  for (std::size_t i = 0; i < kids.size(); ++i) {
    kids[i] = crew::fork(skynet_fork_node(num + static_cast<long>(i) * step, step));
  }
  long sum = 0;
  for (auto k = kids.rbegin(); k != kids.rend(); ++k) sum += co_await *k;
  co_return sum;
}
crew::Co<long> skynet_fork(crew::Pool& /*pool*/, int depth) {
  co_return co_await skynet_fork_node(0, pow10(depth));
}

long skynet_group_node(crew::Pool& pool, long num, long size) {
  if (size == 1) return num;
  long part[kSkynetFan] = {};
  const long step = size / kSkynetFan;
  crew::Group g(pool);
  for (int i = 0; i < kSkynetFan; ++i) {
    (void)g.submit(
        [&pool, &part, i, num, step] { part[i] = skynet_group_node(pool, num + i * step, step); });
  }
  g.wait();
  long sum = 0;
  for (const long p : part) sum += p;
  return sum;
}
long skynet_group(crew::Pool& pool, int depth) { return skynet_group_node(pool, 0, pow10(depth)); }

long skynet_tbb_node(long num, long size) {
  if (size == 1) return num;
  long part[kSkynetFan] = {};
  const long step = size / kSkynetFan;
  tbb::task_group g;
  for (int i = 0; i < kSkynetFan; ++i) {
    g.run([&part, i, num, step] { part[i] = skynet_tbb_node(num + i * step, step); });
  }
  g.wait();
  long sum = 0;
  for (const long p : part) sum += p;
  return sum;
}
long skynet_tbb(int depth) { return skynet_tbb_node(0, pow10(depth)); }

// nqueens(n): the placements of n queens; one call per queen placed.
struct Board {
  unsigned cols, left, right;  // attacked columns, diagonals (this row)
  [[nodiscard]] Board place(unsigned bit) const {
    return {cols | bit, (left | bit) << 1, (right | bit) >> 1};
  }
  [[nodiscard]] unsigned free(int n) const { return ~(cols | left | right) & ((1u << n) - 1); }
};

crew::Co<long> queens_node(crew::Pool& pool, int n, int row, Board b) {
  if (row == n) co_return 1;
  std::vector<crew::Task<long>> kids;
  for (unsigned f = b.free(n); f != 0; f &= f - 1) {
    kids.push_back(crew::spawn(pool, queens_node(pool, n, row + 1, b.place(f & -f))));
  }
  long sum = 0;
  for (crew::Task<long>& k : kids) sum += co_await k;
  co_return sum;
}
crew::Co<long> queens_co(crew::Pool& pool, int n) {
  co_return co_await queens_node(pool, n, 0, Board{0, 0, 0});
}

crew::Co<long> queens_fork_node(int n, int row, Board b) {
  if (row == n) co_return 1;
  std::vector<crew::Forked<long>> kids;
  for (unsigned f = b.free(n); f != 0; f &= f - 1) {
    kids.push_back(crew::fork(queens_fork_node(n, row + 1, b.place(f & -f))));
  }
  long sum = 0;
  for (crew::Forked<long>& k : kids) sum += co_await k;
  co_return sum;
}
crew::Co<long> queens_fork(crew::Pool& /*pool*/, int n) {
  co_return co_await queens_fork_node(n, 0, Board{0, 0, 0});
}

long queens_group_node(crew::Pool& pool, int n, int row, Board b) {
  if (row == n) return 1;
  long part[32] = {};
  int k = 0;
  crew::Group g(pool);
  for (unsigned f = b.free(n); f != 0; f &= f - 1, ++k) {
    const Board next = b.place(f & -f);
    (void)g.submit(
        [&pool, &part, k, n, row, next] { part[k] = queens_group_node(pool, n, row + 1, next); });
  }
  g.wait();
  long sum = 0;
  for (int i = 0; i < k; ++i) sum += part[i];
  return sum;
}
long queens_group(crew::Pool& pool, int n) { return queens_group_node(pool, n, 0, Board{0, 0, 0}); }

long queens_tbb_node(int n, int row, Board b) {
  if (row == n) return 1;
  long part[32] = {};
  int k = 0;
  tbb::task_group g;
  for (unsigned f = b.free(n); f != 0; f &= f - 1, ++k) {
    const Board next = b.place(f & -f);
    g.run([&part, k, n, row, next] { part[k] = queens_tbb_node(n, row + 1, next); });
  }
  g.wait();
  long sum = 0;
  for (int i = 0; i < k; ++i) sum += part[i];
  return sum;
}
long queens_tbb(int n) { return queens_tbb_node(n, 0, Board{0, 0, 0}); }

// matmul(n): C += A * B on n x n doubles, split into quadrants down to
// kLeaf (8 products per split, in two rounds of 4 that write disjoint
// quadrants of C). The result is the sum of C (small integers: exact).
constexpr int kLeaf = 64;

struct Block {
  double* p;
  int stride;
  [[nodiscard]] Block quad(int i, int j, int h) const {
    return {p + static_cast<std::ptrdiff_t>(i) * h * stride + j * h, stride};
  }
  double& at(int i, int j) const { return p[static_cast<std::ptrdiff_t>(i) * stride + j]; }
};

void mm_leaf(Block c, Block a, Block b, int n) {
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < n; ++k) {
      const double x = a.at(i, k);
      for (int j = 0; j < n; ++j) c.at(i, j) += x * b.at(k, j);
    }
  }
}

// The 8 products of one split: round r (0, 1), product q (0-3).
struct Product {
  Block c, a, b;
};
Product product(Block c, Block a, Block b, int h, int r, int q) {
  const int i = q / 2;
  const int j = q % 2;
  return {c.quad(i, j, h), a.quad(i, r, h), b.quad(r, j, h)};
}

crew::Co<void> mm_co(crew::Pool& pool, Block c, Block a, Block b, int n) {
  if (n <= kLeaf) {
    mm_leaf(c, a, b, n);
    co_return;
  }
  const int h = n / 2;
  for (int r = 0; r < 2; ++r) {
    std::vector<crew::Task<void>> kids;
    kids.reserve(4);
    for (int q = 0; q < 4; ++q) {
      const Product p = product(c, a, b, h, r, q);
      kids.push_back(crew::spawn(pool, mm_co(pool, p.c, p.a, p.b, h)));
    }
    for (crew::Task<void>& k : kids) co_await k;
  }
}

crew::Co<void> mm_fork(Block c, Block a, Block b, int n) {
  if (n <= kLeaf) {
    mm_leaf(c, a, b, n);
    co_return;
  }
  const int h = n / 2;
  for (int r = 0; r < 2; ++r) {
    std::vector<crew::Forked<void>> kids;
    kids.reserve(4);
    for (int q = 0; q < 4; ++q) {
      const Product p = product(c, a, b, h, r, q);
      kids.push_back(crew::fork(mm_fork(p.c, p.a, p.b, h)));
    }
    for (crew::Forked<void>& k : kids) co_await k;
  }
}

void mm_group(crew::Pool& pool, Block c, Block a, Block b, int n) {
  if (n <= kLeaf) return mm_leaf(c, a, b, n);
  const int h = n / 2;
  for (int r = 0; r < 2; ++r) {
    crew::Group g(pool);
    for (int q = 0; q < 4; ++q) {
      const Product p = product(c, a, b, h, r, q);
      (void)g.submit([&pool, p, h] { mm_group(pool, p.c, p.a, p.b, h); });
    }
    g.wait();
  }
}

void mm_tbb(Block c, Block a, Block b, int n) {
  if (n <= kLeaf) return mm_leaf(c, a, b, n);
  const int h = n / 2;
  for (int r = 0; r < 2; ++r) {
    tbb::task_group g;
    for (int q = 0; q < 4; ++q) {
      const Product p = product(c, a, b, h, r, q);
      g.run([p, h] { mm_tbb(p.c, p.a, p.b, h); });
    }
    g.wait();
  }
}

// A, B and C of one matmul run.
struct Matrices {
  int n;
  std::vector<double> a, b, c;
  explicit Matrices(int size)
      : n(size),
        a(static_cast<std::size_t>(size) * static_cast<std::size_t>(size)),
        b(a.size()),
        c(a.size(), 0.0) {
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = static_cast<double>(i % 3);
      b[i] = static_cast<double>((i / 7) % 4);
    }
  }
  Block block(std::vector<double>& m) { return {m.data(), n}; }
  [[nodiscard]] long sum() const {
    double s = 0;
    for (const double x : c) s += x;
    return static_cast<long>(s);
  }
};

crew::Co<long> matmul_co(crew::Pool& pool, int n) {
  Matrices m(n);
  co_await mm_co(pool, m.block(m.c), m.block(m.a), m.block(m.b), n);
  co_return m.sum();
}
crew::Co<long> matmul_fork(crew::Pool& /*pool*/, int n) {
  Matrices m(n);
  co_await mm_fork(m.block(m.c), m.block(m.a), m.block(m.b), n);
  co_return m.sum();
}
long matmul_group(crew::Pool& pool, int n) {
  Matrices m(n);
  mm_group(pool, m.block(m.c), m.block(m.a), m.block(m.b), n);
  return m.sum();
}
long matmul_tbb(int n) {
  Matrices m(n);
  mm_tbb(m.block(m.c), m.block(m.a), m.block(m.b), n);
  return m.sum();
}

// One workload four ways, each on 2 threads, after a smaller warm-up run:
// a coroutine task per call (spawn), forked children of one coroutine task
// (crew::fork), crew::Group, oneTBB's task_group.
struct ForkJoin {
  crew::Co<long> (*co)(crew::Pool&, int);
  crew::Co<long> (*forked)(crew::Pool&, int);
  long (*group)(crew::Pool&, int);
  long (*tbb)(int);
  int warm;
  int n;
};

Result four_ways(const ForkJoin& w) {
  Result r;
  long expect = 0;
  {
    crew::Pool pool(two_workers("forkjoin"));
    (void)crew::spawn(pool, w.co(pool, w.warm)).get();  // warm caches
    const auto t0 = Clock::now();
    expect = crew::spawn(pool, w.co(pool, w.n)).get();
    r["coroutine_s"] = secs(Clock::now() - t0);
  }
  {
    crew::Pool pool(two_workers("forkjoin"));
    (void)crew::spawn(pool, w.forked(pool, w.warm)).get();
    const auto t0 = Clock::now();
    const long v = crew::spawn(pool, w.forked(pool, w.n)).get();
    r["forked_s"] = secs(Clock::now() - t0);
    if (v != expect) std::abort();
  }
  {
    crew::Pool pool(two_workers("forkjoin"));
    (void)pool.submit([&pool, &w] { return w.group(pool, w.warm); }).get();
    const auto t0 = Clock::now();
    const long v = pool.submit([&pool, &w] { return w.group(pool, w.n); }).get();
    r["group_s"] = secs(Clock::now() - t0);
    if (v != expect) std::abort();
  }
  {
    tbb::task_arena arena(2, 1);
    long v = 0;
    arena.execute([&] { v = w.tbb(w.warm); });
    const auto t0 = Clock::now();
    arena.execute([&] { v = w.tbb(w.n); });
    r["tbb_s"] = secs(Clock::now() - t0);
    if (v != expect) std::abort();
  }
  r["coroutine_over_group"] = r["coroutine_s"] / r["group_s"];
  r["coroutine_over_tbb"] = r["coroutine_s"] / r["tbb_s"];
  r["forked_over_group"] = r["forked_s"] / r["group_s"];
  r["forked_over_tbb"] = r["forked_s"] / r["tbb_s"];
  return r;
}

Result fib() { return four_ways({fib_co, fib_fork, fib_group, fib_tbb, 20, 30}); }
Result skynet() { return four_ways({skynet_co, skynet_fork, skynet_group, skynet_tbb, 4, 6}); }
Result nqueens() { return four_ways({queens_co, queens_fork, queens_group, queens_tbb, 8, 11}); }
Result matmul() { return four_ways({matmul_co, matmul_fork, matmul_group, matmul_tbb, 256, 1024}); }

// ---- latency ----
std::int64_t now_ns() { return Clock::now().time_since_epoch().count(); }

crew::Co<void> late_after_timer(std::vector<double>* out, int n) {
  for (int i = 0; i < n; ++i) {
    const auto at = Clock::now() + 200us;
    co_await crew::sleep_until(at);
    out->push_back(static_cast<double>((Clock::now() - at).count()) / 1000.0);
  }
}

crew::Co<void> end_at(std::int64_t* at) {
  co_await crew::sleep_for(100us);
  *at = now_ns();
}

crew::Co<void> resumed_by_end(crew::Pool* pool, std::vector<double>* out, int n) {
  for (int i = 0; i < n; ++i) {
    std::int64_t ended = 0;
    crew::Task<void> t = crew::spawn(*pool, end_at(&ended));
    co_await t;
    out->push_back(static_cast<double>(now_ns() - ended) / 1000.0);
  }
}

Result latency() {
  constexpr int kN = 2000;
  crew::Pool pool(two_workers("latency"));
  std::vector<double> post_us;
  post_us.reserve(kN);
  for (int i = 0; i < kN; ++i) {
    std::atomic<std::int64_t> ran{0};
    const std::int64_t t0 = now_ns();
    (void)pool.post([&ran] { ran.store(now_ns()); });
    while (ran.load() == 0) std::this_thread::yield();
    post_us.push_back(static_cast<double>(ran.load() - t0) / 1000.0);
    std::this_thread::sleep_for(200us);  // workers go idle, as before a timer
  }
  std::vector<double> timer_us;
  timer_us.reserve(kN);
  crew::spawn(pool, late_after_timer(&timer_us, kN)).get();
  std::vector<double> await_us;
  await_us.reserve(kN);
  crew::spawn(pool, resumed_by_end(&pool, &await_us, kN)).get();
  return {{"post_p50_us", percentile(post_us, 0.5)},
          {"post_p99_us", percentile(post_us, 0.99)},
          {"timer_p50_us", percentile(timer_us, 0.5)},
          {"timer_p99_us", percentile(timer_us, 0.99)},
          {"await_end_p50_us", percentile(await_us, 0.5)},
          {"await_end_p99_us", percentile(await_us, 0.99)}};
}

// ---- cancel ----
crew::Co<void> wait_long(std::atomic<int>* started) {
  started->fetch_add(1, std::memory_order_relaxed);
  co_await crew::sleep_for(60s);
}

Result cancel() {
  constexpr int kN = 10'000;
  crew::Pool pool(two_workers("cancel"));
  std::atomic<int> started{0};
  std::vector<crew::Task<void>> tasks;
  tasks.reserve(kN);
  for (int i = 0; i < kN; ++i) tasks.push_back(crew::spawn(pool, wait_long(&started)));
  while (started.load() != kN) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms);  // every one suspended
  const auto t0 = Clock::now();
  for (auto& t : tasks) (void)t.cancel();
  const double cancels_ms = secs(Clock::now() - t0) * 1000.0;
  for (auto& t : tasks) t.wait();
  const double ms = secs(Clock::now() - t0) * 1000.0;
  for (auto& t : tasks) {
    if (t.status() != crew::TaskStatus::cancelled) std::abort();
  }
  return {{"all_ended_ms", ms}, {"cancel_calls_ms", cancels_ms}};
}

// ---- deadline ----
crew::Co<void> overslept(Clock::time_point spawned, std::vector<double>* out, int i) {
  try {
    co_await crew::sleep_for(10s);
  } catch (const crew::Error&) {
  }
  (*out)[static_cast<std::size_t>(i)] = secs(Clock::now() - spawned) * 1000.0;
}

Result deadline() {
  constexpr int kN = 200;
  crew::Pool pool(two_workers("deadline"));
  std::vector<double> ms(kN, 0.0);
  std::vector<crew::Task<void>> tasks;
  for (int i = 0; i < kN; ++i) {
    tasks.push_back(crew::spawn(pool, overslept(Clock::now(), &ms, i), {.timeout = 100ms}));
    std::this_thread::sleep_for(1ms);  // deadlines spread over 200 ms
  }
  for (auto& t : tasks) t.wait();
  return {{"p50_ms", percentile(ms, 0.5)}, {"p99_ms", percentile(ms, 0.99)}};
}

// Runs `f` in a child process; its figures come back through a pipe.
Result in_child(const std::function<Result()>& f) {
  int fds[2];
  if (pipe(fds) != 0) std::abort();
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const Result r = f();
    std::string out;
    for (const auto& [k, v] : r) out += k + " " + std::to_string(v) + "\n";
    (void)!write(fds[1], out.data(), out.size());
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  ssize_t n = 0;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "a workload's child failed (status %d)\n", status);
    std::exit(1);
  }
  Result r;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t nl = text.find('\n', pos);
    const std::string line = text.substr(pos, nl - pos);
    const std::size_t sp = line.find(' ');
    r[line.substr(0, sp)] = std::strtod(line.c_str() + sp + 1, nullptr);
    pos = nl + 1;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
  }
  const std::vector<std::pair<std::string, std::function<Result()>>> workloads = {
      {"sleepers", sleepers}, {"fib", fib},         {"skynet", skynet}, {"nqueens", nqueens},
      {"matmul", matmul},     {"latency", latency}, {"cancel", cancel}, {"deadline", deadline}};
  std::map<std::string, std::map<std::string, std::vector<double>>> all;
  for (int round = 0; round < rounds; ++round) {
    for (const auto& [name, f] : workloads) {
      if (!only.empty() && only != name) continue;
      const Result r = in_child(f);
      std::printf("round %d %s:", round + 1, name.c_str());
      for (const auto& [k, v] : r) {
        std::printf(" %s=%.3f", k.c_str(), v);
        all[name][k].push_back(v);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  std::printf("\nmedians over %d rounds\n", rounds);
  for (const auto& [name, figures] : all) {
    for (const auto& [k, v] : figures) {
      std::printf("%-10s %-26s %10.3f\n", name.c_str(), k.c_str(), percentile(v, 0.5));
    }
  }
  return 0;
}
