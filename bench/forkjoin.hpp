// bench/forkjoin.hpp: the fork-join workloads (fib, skynet, nqueens, matmul),
// written once against a small runtime interface that crew's Group, crew's
// Task handles and oneTBB's task_group each implement:
//
//   struct Runtime {
//     class Scope {                 // one per inner node of the recursion
//       explicit Scope(Runtime&);
//       void spawn(F&& f);          // a child task
//       void wait();                // until every child spawned so far ended
//     };
//     void run_root(F&& f);         // from the main thread: f as a task, waited for
//   };
//
// Every call of the recursion is one task (no sequential cutoff), so the
// figures are the runtime's cost per task. Children write their results
// into the parent's frame; the parent reads them after wait().
//
//   fib(n)      binary recursion; 2 fib(n+1) - 1 tasks; result checked
//               against the iterative value.
//   skynet(d)   10-way fan-out to depth d; the N = 10^d leaves return their
//               index; the sum must be N(N-1)/2. (10^(d+1) - 1) / 9 tasks.
//   nqueens(n)  one task per legal placement of the next queen (the root
//               is the empty board); counts the solutions (n = 10: 724,
//               11: 2,680, 12: 14,200). Tasks = nodes of the search tree,
//               counted sequentially beforehand.
//   matmul(N)   C += A B on N x N doubles, split 4 ways down to 32 x 32
//               blocks (a serial i-k-j kernel). Each node runs two phases
//               of 4 children (C11 += A11 B11, C12 += A11 B12, C21 += A21
//               B11, C22 += A21 B12; then the A12 / A22 halves), so no two
//               tasks write one block at once. (8^(L+1) - 1) / 7 tasks for
//               L = log2(N / 32). The entries are small integers, so the
//               result is exact: every row sum, every column sum and 64
//               sampled entries are checked.
//
// A measurement builds the runtime (a fresh pool), primes it, runs the
// workload once untimed (checked) and once timed (checked). ns_per_task is
// the timed run's wall time x kWorkers / tasks: thread time per task.
//
// Stack tracking: with fork_join_config().track_stack each task notes the
// address of its frame; the figure is the deepest distance from the top of
// its thread's stack (pthread_getattr_np) that any thread reached, so it
// includes the few KiB a thread uses before its first task.
#pragma once

#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness.hpp"

namespace bench {

// Set by main.cpp before the first run, read by the runs (and inherited by
// the child processes of run_isolated()).
struct ForkJoinConfig {
  unsigned fib = 30;
  unsigned skynet = 6;
  unsigned nqueens = 11;
  unsigned matmul = 1024;
  bool track_stack = false;  // main.cpp turns it on for one extra run per pair
  bool isolate = true;       // crew's runs in a child process (isolate.hpp)
  int timeout_seconds = 60;  // of one isolated run
  // crew's pools only (the completion matrix of --fj-matrix varies them):
  std::size_t crew_workers = kWorkers;
  bool crew_unbounded = false;  // queue_capacity = crew::kUnbounded
};

inline ForkJoinConfig& fork_join_config() {
  static ForkJoinConfig config;
  return config;
}

inline constexpr std::size_t kMaxFanout = 16;  // nqueens(n) for n <= 16; skynet 10
inline constexpr unsigned kMaxQueens = kMaxFanout;
inline constexpr std::size_t kMatmulLeaf = 32;

[[nodiscard]] inline unsigned fork_join_size(Workload w) {
  const ForkJoinConfig& c = fork_join_config();
  switch (w) {
    case Workload::fib:
      return c.fib;
    case Workload::skynet:
      return c.skynet;
    case Workload::nqueens:
      return c.nqueens;
    case Workload::matmul:
      return c.matmul;
    default:
      fail("not a fork-join workload");
  }
}

// ---- stack tracking ----

namespace stack_probe {

// Bumped before each tracked run; a thread whose generation differs starts
// over (TBB's workers and the main thread outlive a run).
inline std::atomic<unsigned> generation{1};
inline std::atomic<std::uintptr_t> deepest{0};  // bytes below a stack's top

struct ThreadState {
  unsigned generation = 0;
  std::uintptr_t top = 0;
  std::uintptr_t lowest = 0;
};
inline thread_local ThreadState t_state;

[[nodiscard]] inline std::uintptr_t stack_top() noexcept {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return 0;
  void* base = nullptr;
  std::size_t size = 0;
  pthread_attr_getstack(&attr, &base, &size);
  pthread_attr_destroy(&attr);
  return reinterpret_cast<std::uintptr_t>(base) + size;
}

[[gnu::noinline]] inline void note_slow(std::uintptr_t here) noexcept {
  ThreadState& t = t_state;
  const unsigned gen = generation.load(std::memory_order_relaxed);
  if (t.generation != gen) t = {gen, stack_top(), here + 1};
  if (here >= t.lowest || t.top == 0) return;
  t.lowest = here;
  const std::uintptr_t depth = t.top - here;
  std::uintptr_t seen = deepest.load(std::memory_order_relaxed);
  while (depth > seen && !deepest.compare_exchange_weak(seen, depth)) {
  }
}

}  // namespace stack_probe

inline void reset_stack_peak() noexcept {
  stack_probe::generation.fetch_add(1);
  stack_probe::deepest.store(0);
}
[[nodiscard]] inline double stack_peak_kib() noexcept {
  return static_cast<double>(stack_probe::deepest.load()) / 1024.0;
}

// Called at the start of every task of the fork-join workloads.
inline void note_stack() noexcept {
  if (!fork_join_config().track_stack) return;
  const auto here = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  const stack_probe::ThreadState& t = stack_probe::t_state;
  if (t.generation == stack_probe::generation.load(std::memory_order_relaxed) && here >= t.lowest) {
    return;
  }
  stack_probe::note_slow(here);
}

// ---- the workloads ----

template <class R>
void fib_node(R& rt, unsigned n, std::uint64_t* out) {
  note_stack();
  if (n < 2) {
    *out = n;
    return;
  }
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  typename R::Scope scope(rt);
  scope.spawn([&rt, n, &a] { fib_node(rt, n - 1, &a); });
  scope.spawn([&rt, n, &b] { fib_node(rt, n - 2, &b); });
  scope.wait();
  *out = a + b;
}

// Leaves are numbered num .. num + size - 1.
template <class R>
void skynet_node(R& rt, std::uint64_t num, std::uint64_t size, std::uint64_t* out) {
  note_stack();
  if (size == 1) {
    *out = num;
    return;
  }
  std::array<std::uint64_t, 10> sums{};
  const std::uint64_t part = size / 10;
  typename R::Scope scope(rt);
  for (std::uint64_t i = 0; i < 10; ++i) {
    scope.spawn(
        [&rt, num = num + i * part, part, out = &sums[i]] { skynet_node(rt, num, part, out); });
  }
  scope.wait();
  std::uint64_t sum = 0;
  for (std::uint64_t s : sums) sum += s;
  *out = sum;
}

// Queens placed on rows 0 .. depth-1: cols[row] is the column.
struct Board {
  std::array<std::int8_t, kMaxQueens> cols{};
};

[[nodiscard]] inline bool queen_fits(const Board& b, unsigned depth, unsigned col) noexcept {
  for (unsigned row = 0; row < depth; ++row) {
    const int c = b.cols[row];
    const int d = static_cast<int>(depth - row);
    if (c == static_cast<int>(col) || c == static_cast<int>(col) - d ||
        c == static_cast<int>(col) + d) {
      return false;
    }
  }
  return true;
}

template <class R>
void nqueens_node(R& rt, unsigned n, unsigned depth, Board board, std::uint64_t* out) {
  note_stack();
  if (depth == n) {
    *out = 1;
    return;
  }
  std::array<std::uint64_t, kMaxQueens> counts{};
  typename R::Scope scope(rt);
  for (unsigned col = 0; col < n; ++col) {
    if (!queen_fits(board, depth, col)) continue;
    Board next = board;
    next.cols[depth] = static_cast<std::int8_t>(col);
    scope.spawn(
        [&rt, n, depth, next, out = &counts[col]] { nqueens_node(rt, n, depth + 1, next, out); });
  }
  scope.wait();
  std::uint64_t sum = 0;
  for (std::uint64_t c : counts) sum += c;
  *out = sum;
}

// Nodes of nqueens(n)'s search tree, the root included: its task count.
inline std::uint64_t nqueens_nodes(unsigned n, unsigned depth, Board& board) {
  std::uint64_t nodes = 1;
  if (depth == n) return nodes;
  for (unsigned col = 0; col < n; ++col) {
    if (!queen_fits(board, depth, col)) continue;
    board.cols[depth] = static_cast<std::int8_t>(col);
    nodes += nqueens_nodes(n, depth + 1, board);
  }
  return nodes;
}

// Row-major N x N with stride N; a block is a pointer to its top-left entry.
// Never inlined: every runtime calls the same machine code, so that the
// comparison measures scheduling, not how the compiler laid out the kernel
// inside each runtime's instantiation of matmul_node.
[[gnu::noinline]] inline void matmul_leaf(const double* a, const double* b, double* c,
                                          std::size_t stride) {
  for (std::size_t i = 0; i < kMatmulLeaf; ++i) {
    double* ci = c + i * stride;
    for (std::size_t k = 0; k < kMatmulLeaf; ++k) {
      const double aik = a[i * stride + k];
      const double* bk = b + k * stride;
      for (std::size_t j = 0; j < kMatmulLeaf; ++j) ci[j] += aik * bk[j];
    }
  }
}

// C += A B for n x n blocks.
template <class R>
void matmul_node(R& rt, const double* a, const double* b, double* c, std::size_t n,
                 std::size_t stride) {
  note_stack();
  if (n <= kMatmulLeaf) {
    matmul_leaf(a, b, c, stride);
    return;
  }
  const std::size_t h = n / 2;
  const std::size_t down = h * stride;
  typename R::Scope scope(rt);
  auto child = [&rt, h, stride](const double* x, const double* y, double* z) {
    return [&rt, x, y, z, h, stride] { matmul_node(rt, x, y, z, h, stride); };
  };
  // Phase 1: the A11 / A21 halves.
  scope.spawn(child(a, b, c));
  scope.spawn(child(a, b + h, c + h));
  scope.spawn(child(a + down, b, c + down));
  scope.spawn(child(a + down, b + h, c + down + h));
  scope.wait();
  // Phase 2: the A12 / A22 halves, into the same four blocks.
  scope.spawn(child(a + h, b + down, c));
  scope.spawn(child(a + h, b + down + h, c + h));
  scope.spawn(child(a + down + h, b + down, c + down));
  scope.spawn(child(a + down + h, b + down + h, c + down + h));
  scope.wait();
}

// The matrices of one matmul measurement: small integers, so that every
// sum below is exact in double.
class MatmulData {
 public:
  explicit MatmulData(std::size_t n) : n_(n), a_(n * n), b_(n * n), c_(n * n) {
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        a_[i * n + j] = static_cast<double>(static_cast<int>((i * 7 + j * 3) % 11) - 5);
        b_[i * n + j] = static_cast<double>(static_cast<int>((i * 5 + j * 13) % 9) - 4);
      }
    }
  }
  void clear() { std::fill(c_.begin(), c_.end(), 0.0); }
  [[nodiscard]] const double* a() const { return a_.data(); }
  [[nodiscard]] const double* b() const { return b_.data(); }
  [[nodiscard]] double* c() { return c_.data(); }
  [[nodiscard]] std::size_t n() const { return n_; }

  // Row sums of C against A (row sums of B); column sums of C against
  // (column sums of A) B; and 64 entries computed directly.
  void check() const {
    const std::size_t n = n_;
    std::vector<double> b_row(n, 0.0), a_col(n, 0.0);
    for (std::size_t k = 0; k < n; ++k) {
      for (std::size_t j = 0; j < n; ++j) {
        b_row[k] += b_[k * n + j];
        a_col[j] += a_[k * n + j];
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      double want = 0, got = 0;
      for (std::size_t k = 0; k < n; ++k) want += a_[i * n + k] * b_row[k];
      for (std::size_t j = 0; j < n; ++j) got += c_[i * n + j];
      if (want != got) fail("matmul: wrong row sum");
    }
    std::vector<double> col_want(n, 0.0), col_got(n, 0.0);
    for (std::size_t k = 0; k < n; ++k) {
      for (std::size_t j = 0; j < n; ++j) {
        col_want[j] += a_col[k] * b_[k * n + j];
        col_got[j] += c_[k * n + j];
      }
    }
    if (col_want != col_got) fail("matmul: wrong column sum");
    for (std::size_t s = 0; s < 64; ++s) {
      const std::size_t i = (s * 2654435761u) % n;
      const std::size_t j = (s * 40503u + 17) % n;
      double want = 0;
      for (std::size_t k = 0; k < n; ++k) want += a_[i * n + k] * b_[k * n + j];
      if (want != c_[i * n + j]) fail("matmul: wrong entry");
    }
  }

 private:
  std::size_t n_;
  std::vector<double> a_, b_, c_;
};

[[nodiscard]] inline std::uint64_t fib_value(unsigned n) {
  std::uint64_t a = 0, b = 1;
  for (unsigned i = 0; i < n; ++i) b = std::exchange(a, b) + b;
  return a;
}

// Checks the size of a fork-join workload; "" if it is valid.
[[nodiscard]] inline std::string fork_join_size_error(Workload w, unsigned size) {
  switch (w) {
    case Workload::fib:
      return size <= 60 ? "" : "fib: n must be at most 60";
    case Workload::skynet:
      return size >= 1 && size <= 9 ? "" : "skynet: depth must be 1..9";
    case Workload::nqueens:
      return size >= 1 && size <= kMaxQueens ? "" : "nqueens: n must be 1..16";
    case Workload::matmul:
      return size >= kMatmulLeaf && (size & (size - 1)) == 0
                 ? ""
                 : "matmul: N must be a power of two >= 32";
    default:
      return "not a fork-join workload";
  }
}

// Tasks one run of `w` at `size` creates.
[[nodiscard]] inline std::uint64_t fork_join_tasks(Workload w, unsigned size) {
  switch (w) {
    case Workload::fib:
      return 2 * fib_value(size + 1) - 1;
    case Workload::skynet: {
      std::uint64_t nodes = 0, level = 1;
      for (unsigned d = 0; d <= size; ++d, level *= 10) nodes += level;
      return nodes;
    }
    case Workload::nqueens: {
      Board b;
      return nqueens_nodes(size, 0, b);
    }
    case Workload::matmul: {
      std::uint64_t nodes = 0, level = 1;
      for (std::size_t n = size; n >= kMatmulLeaf; n /= 2, level *= 8) nodes += level;
      return nodes;
    }
    default:
      fail("not a fork-join workload");
  }
}

// Solutions of nqueens(n), n = 0 .. 16 (OEIS A000170).
[[nodiscard]] inline std::uint64_t known_queens_solutions(unsigned n) {
  constexpr std::array<std::uint64_t, 17> kSolutions = {
      1, 1, 0, 0, 2, 10, 4, 40, 92, 352, 724, 2680, 14200, 73712, 365596, 2279184, 14772512};
  return n < kSolutions.size() ? kSolutions[n] : 0;
}

// One run of `w` on `rt`, its result checked.
template <class R>
void run_fork_join_once(R& rt, Workload w, unsigned size, MatmulData* matrices) {
  std::uint64_t result = 0;
  switch (w) {
    case Workload::fib:
      rt.run_root([&rt, size, &result] { fib_node(rt, size, &result); });
      if (result != fib_value(size)) fail("fib: wrong result");
      return;
    case Workload::skynet: {
      std::uint64_t leaves = 1;
      for (unsigned d = 0; d < size; ++d) leaves *= 10;
      rt.run_root([&rt, leaves, &result] { skynet_node(rt, 0, leaves, &result); });
      if (result != leaves * (leaves - 1) / 2) fail("skynet: wrong sum");
      return;
    }
    case Workload::nqueens:
      rt.run_root([&rt, size, &result] { nqueens_node(rt, size, 0, Board{}, &result); });
      if (result != known_queens_solutions(size)) fail("nqueens: wrong count of solutions");
      return;
    case Workload::matmul:
      matrices->clear();
      rt.run_root([&rt, m = matrices] { matmul_node(rt, m->a(), m->b(), m->c(), m->n(), m->n()); });
      matrices->check();
      return;
    default:
      fail("not a fork-join workload");
  }
}

// A measurement on a runtime built by the caller (see the top of the file).
template <class R>
Sample measure_fork_join(R& rt, Workload w) {
  const unsigned size = fork_join_size(w);
  const std::uint64_t tasks = fork_join_tasks(w, size);
  std::vector<MatmulData> matrices;
  if (w == Workload::matmul) matrices.emplace_back(size);
  MatmulData* m = matrices.empty() ? nullptr : &matrices.front();
  {  // prime: the workers started and parked
    std::uint64_t r = 0;
    rt.run_root([&rt, &r] { fib_node(rt, 8, &r); });
    if (r != fib_value(8)) fail("fib: wrong result");
  }
  reset_stack_peak();
  run_fork_join_once(rt, w, size, m);  // warm-up: heap and caches
  Sample s = timed(tasks, [&] { run_fork_join_once(rt, w, size, m); });
  s.ns_per_task *= static_cast<double>(kWorkers);
  if (fork_join_config().track_stack) s.stack_kib = stack_peak_kib();
  return s;
}

}  // namespace bench
