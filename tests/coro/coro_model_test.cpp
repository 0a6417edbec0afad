// Random coroutine programs against a model of what crew/coro.hpp promises.
//
// A program is a few root coroutine tasks, each a random tree: a node runs
// a sequence of steps (sleep, yield, await a child Co in the same task,
// spawn a child coroutine task, with spawn or spawn_when_room, and await
// its handle, submit a plain task and await it, when_all over spawned
// children, spawn a detached child, fork 1-3 children (crew::fork) and join
// them in fork order or newest first, throw), some of them catching what
// the awaited child throws. A forked child's subtree has only the steps a
// forked child may take (await a Co, fork, throw) and sleeps, which throw
// Errc::wait_in_fork there. The roots
// get, at random, a cancel() after a delay or a timeout; the pool has 1-3
// workers and a queue of 2, 8 or 1024 tasks (a full one blocks or runs the
// task on the caller), in half of the programs the overload controller
// on (a 1 ms target, its limit at most 2 or 3), in half timed tasks
// (time_tasks); meanwhile the program's thread pauses and resumes the pool,
// resizes it, or waits for it to be idle; it ends with a drain, soft or
// hard shutdown.
//
// The model evaluates each tree as if nothing stopped it: the value a root
// returns, or that it throws. What is checked:
// - wait_idle() returns (within 10 s) only once every root has ended;
// - every root's handle ends once in a final status that never changes;
//   untouched by a stop (no cancel, no timeout, a drain), exactly the
//   model's outcome and value; otherwise the model's outcome or the stop's
//   (cancelled, timed_out), and a success always carries the model's value;
//   with the controller on, a root may also be refused at its spawn
//   (rejected, Admission::overloaded), never having run; without it,
//   never; and a root is never shed (CoDel does not drop a coroutine
//   task's start);
// - a root's handle shows a queue wait and a run time only in a timed pool;
// - after the shutdown the controller counts nothing admitted;
// - after the shutdown, stats() counts one outcome per submission
//   (coroutine tasks, their children and plain tasks alike);
// - no frame outlives the pool (a FrameGuard in every frame);
// - a detached child's exception reaches the pool's handler at most once,
//   and exactly once for each throwing detached child of a program nothing
//   stopped.
// RapidCheck generates the programs and shrinks a failing one; the number
// of programs: RC_PARAMS="max_success=N" (see tests/pool/model_test.cpp).
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "coro_test_util.hpp"
#include "crew/coro.hpp"
#include "crew/pool.hpp"
#include "random_programs.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::FrameGuard;
using test::Watchdog;

// ---------------------------------------------------------------------------
// The programs.

struct Node;

enum class StepKind {
  sleep,
  yield,
  inline_child,
  task_child,
  plain,
  when_all,
  detached,
  fork,
  throw_
};

struct Step {
  StepKind kind = StepKind::yield;
  int ms = 0;                 // sleep
  int plain_value = 0;        // plain: what the plain task returns (negative: it throws)
  bool catch_errors = false;  // inline_child, task_child, plain, when_all
  bool when_room = false;     // task_child: spawned with spawn_when_room
  bool newest_first = false;  // fork: the joins' order
  std::vector<Node> kids;     // inline_child, task_child, detached: one; when_all, fork: 1-3
};

struct Node {
  int id = 0;
  std::vector<Step> steps;
};

// What a node does when nothing stops it.
struct Eval {
  bool throws = false;
  long value = 0;
  int detached_throws = 0;       // throwing detached children reached
  bool when_all_failed = false;  // a when_all cancelled its other children
};

constexpr long kCaught = 1000;

// `in_fork`: the node runs in a forked child, where a sleep throws.
Eval eval(const Node& n, bool in_fork = false) {
  Eval e;
  e.value = n.id;
  auto merge = [&](const Eval& k) {
    e.detached_throws += k.detached_throws;
    e.when_all_failed = e.when_all_failed || k.when_all_failed;
  };
  // An awaited result: its value, kCaught if it threw and the step
  // catches, else the node throws (false: stop here).
  auto take = [&](bool threw, long value, bool catch_errors) {
    if (!threw) {
      e.value += value;
    } else if (catch_errors) {
      e.value += kCaught;
    } else {
      e.throws = true;
    }
    return !e.throws;
  };
  for (const Step& s : n.steps) {
    switch (s.kind) {
      case StepKind::sleep:
      case StepKind::yield:
        if (in_fork) {  // Errc::wait_in_fork
          e.throws = true;
          return e;
        }
        break;
      case StepKind::inline_child:
      case StepKind::task_child: {
        const Eval k = eval(s.kids[0], in_fork && s.kind == StepKind::inline_child);
        merge(k);
        if (!take(k.throws, k.value, s.catch_errors)) return e;
        break;
      }
      case StepKind::plain:
        if (!take(s.plain_value < 0, s.plain_value, s.catch_errors)) return e;
        break;
      case StepKind::when_all: {
        bool failed = false;
        long sum = 0;
        for (const Node& kid : s.kids) {
          const Eval k = eval(kid);
          merge(k);
          failed = failed || k.throws;
          sum += k.value;
        }
        if (failed) e.when_all_failed = true;
        if (!take(failed, sum, s.catch_errors)) return e;
        break;
      }
      case StepKind::detached: {
        const Eval k = eval(s.kids[0]);
        merge(k);
        if (k.throws) ++e.detached_throws;
        break;
      }
      case StepKind::fork:
        for (std::size_t i = 0; i < s.kids.size(); ++i) {
          const Eval k = eval(s.kids[s.newest_first ? s.kids.size() - 1 - i : i], true);
          merge(k);
          if (!take(k.throws, k.value, s.catch_errors)) return e;
        }
        break;
      case StepKind::throw_:
        e.throws = true;
        return e;
    }
  }
  return e;
}

void show(std::ostream& os, const Node& n, std::size_t indent) {
  os << std::string(indent, ' ') << "node " << n.id << '\n';
  for (const Step& s : n.steps) {
    os << std::string(indent + 2, ' ');
    switch (s.kind) {
      case StepKind::sleep:
        os << "sleep " << s.ms << " ms\n";
        break;
      case StepKind::yield:
        os << "yield\n";
        break;
      case StepKind::inline_child:
        os << "co_await Co" << (s.catch_errors ? " (catching)" : "") << '\n';
        break;
      case StepKind::task_child:
        os << (s.when_room ? "co_await spawn_when_room" : "co_await spawn")
           << (s.catch_errors ? " (catching)" : "") << '\n';
        break;
      case StepKind::plain:
        os << "co_await submit -> " << s.plain_value << (s.catch_errors ? " (catching)" : "")
           << '\n';
        break;
      case StepKind::when_all:
        os << "when_all of " << s.kids.size() << (s.catch_errors ? " (catching)" : "") << '\n';
        break;
      case StepKind::detached:
        os << "spawn_detached\n";
        break;
      case StepKind::fork:
        os << "fork " << s.kids.size() << ", joined "
           << (s.newest_first ? "newest first" : "in order")
           << (s.catch_errors ? " (catching)" : "") << '\n';
        break;
      case StepKind::throw_:
        os << "throw\n";
        break;
    }
    for (const Node& k : s.kids) show(os, k, indent + 4);
  }
}

Step gen_fork(int depth, int& next_id);

// A forked child's subtree: a sleep (which throws there), a throw, an
// awaited Co, a fork.
Node gen_forked_node(int depth, int& next_id) {
  Node n;
  n.id = next_id++;
  const int steps = *rc::gen::inRange(0, 4);
  for (int i = 0; i < steps; ++i) {
    Step s;
    // Most of a leaf's picks are no step: a leaf mostly returns its id.
    const int pick = *rc::gen::inRange(0, depth > 0 ? 20 : 12);
    if (pick < 1) {
      s.kind = StepKind::sleep;
      s.ms = 1;
    } else if (pick < 2) {
      s.kind = StepKind::throw_;
    } else if (depth <= 0) {
      continue;
    } else if (pick < 9) {
      s.kind = StepKind::inline_child;
      s.catch_errors = *rc::gen::arbitrary<bool>();
      s.kids.push_back(gen_forked_node(depth - 1, next_id));
    } else {
      s = gen_fork(depth, next_id);
    }
    n.steps.push_back(std::move(s));
  }
  return n;
}

Step gen_fork(int depth, int& next_id) {
  Step s;
  s.kind = StepKind::fork;
  s.catch_errors = *rc::gen::arbitrary<bool>();
  s.newest_first = *rc::gen::arbitrary<bool>();
  const int kids = *rc::gen::inRange(1, 4);
  for (int k = 0; k < kids; ++k) s.kids.push_back(gen_forked_node(depth - 1, next_id));
  return s;
}

// A random tree, at most `depth` levels below this node (RapidCheck's
// generators, so a failing program shrinks).
Node gen_node(int depth, int& next_id) {
  Node n;
  n.id = next_id++;
  const int steps = *rc::gen::inRange(0, 5);
  for (int i = 0; i < steps; ++i) {
    Step s;
    const int pick = *rc::gen::inRange(0, depth > 0 ? 20 : 9);
    if (pick >= 16) {
      s = gen_fork(depth, next_id);
    } else if (pick < 3) {
      s.kind = StepKind::sleep;
      s.ms = *rc::gen::inRange(0, 4);
    } else if (pick < 5) {
      s.kind = StepKind::yield;
    } else if (pick < 8) {
      s.kind = StepKind::plain;
      s.plain_value = *rc::gen::inRange(-1, 5);
      s.catch_errors = *rc::gen::arbitrary<bool>();
    } else if (pick < 9) {
      s.kind = StepKind::throw_;
    } else if (pick < 11) {
      s.kind = StepKind::inline_child;
      s.catch_errors = *rc::gen::arbitrary<bool>();
      s.kids.push_back(gen_node(depth - 1, next_id));
    } else if (pick < 13) {
      s.kind = StepKind::task_child;
      s.catch_errors = *rc::gen::arbitrary<bool>();
      s.when_room = *rc::gen::arbitrary<bool>();
      s.kids.push_back(gen_node(depth - 1, next_id));
    } else if (pick < 15) {
      s.kind = StepKind::when_all;
      s.catch_errors = *rc::gen::arbitrary<bool>();
      const int kids = *rc::gen::inRange(1, 4);
      for (int k = 0; k < kids; ++k) s.kids.push_back(gen_node(depth - 1, next_id));
    } else {
      s.kind = StepKind::detached;
      s.kids.push_back(gen_node(depth - 1, next_id));
    }
    n.steps.push_back(std::move(s));
  }
  return n;
}

// ---------------------------------------------------------------------------
// Running a program.

Co<long> run_node(Pool& pool, const Node& n);

// Awaits `t`, catching what it throws when asked to.
template <class T>
Co<long> await_caught(Task<T>& t, bool catch_errors) {
  if (!catch_errors) co_return static_cast<long>(co_await t);
  try {
    co_return static_cast<long>(co_await t);
  } catch (const std::exception&) {
    co_return kCaught;
  }
}

Co<long> run_inline(Pool& pool, const Node& kid, bool catch_errors) {
  if (!catch_errors) co_return co_await run_node(pool, kid);
  try {
    co_return co_await run_node(pool, kid);
  } catch (const std::exception&) {
    co_return kCaught;
  }
}

Co<long> all_of(std::vector<Task<long>>* tasks) {
  long sum = 0;
  for (const long v : co_await when_all(*tasks)) sum += v;
  co_return sum;
}

Co<void> detached_root(Pool& pool, const Node& n) { (void)co_await run_node(pool, n); }

Co<long> run_node(Pool& pool, const Node& n) {
  const FrameGuard guard;
  long value = n.id;
  for (const Step& s : n.steps) {
    switch (s.kind) {
      case StepKind::sleep:
        co_await sleep_for(std::chrono::milliseconds(s.ms));
        break;
      case StepKind::yield:
        co_await yield();
        break;
      case StepKind::inline_child:
        value += co_await run_inline(pool, s.kids[0], s.catch_errors);
        break;
      case StepKind::task_child: {
        // Assigned, not initialized: the Co is named first, or g++ 12
        // frees it twice (docs/coroutines.md, "Traps").
        Task<long> t;
        if (s.when_room) {
          Co<Task<long>> spawning = spawn_when_room(pool, run_node(pool, s.kids[0]));
          t = co_await std::move(spawning);
        } else {
          t = spawn(pool, run_node(pool, s.kids[0]));
        }
        value += co_await await_caught(t, s.catch_errors);
        break;
      }
      case StepKind::plain: {
        const int v = s.plain_value;
        Task<int> t = pool.submit([v] {
          if (v < 0) throw std::runtime_error("plain task");
          return v;
        });
        value += co_await await_caught(t, s.catch_errors);
        break;
      }
      case StepKind::when_all: {
        std::vector<Task<long>> tasks;
        for (const Node& kid : s.kids) tasks.push_back(spawn(pool, run_node(pool, kid)));
        if (!s.catch_errors) {
          value += co_await all_of(&tasks);
        } else {
          try {
            value += co_await all_of(&tasks);
          } catch (const std::exception&) {
            value += kCaught;
          }
        }
        break;
      }
      case StepKind::detached:
        (void)spawn_detached(pool, detached_root(pool, s.kids[0]));
        break;
      case StepKind::fork: {
        std::vector<Forked<long>> kids;
        for (const Node& kid : s.kids) kids.push_back(fork(run_node(pool, kid)));
        for (std::size_t i = 0; i < kids.size(); ++i) {
          Forked<long>& k = kids[s.newest_first ? kids.size() - 1 - i : i];
          if (!s.catch_errors) {
            value += co_await k;
            continue;
          }
          try {
            value += co_await k;
          } catch (const std::exception&) {
            value += kCaught;
          }
        }
        break;
      }
      case StepKind::throw_:
        throw std::runtime_error("node " + std::to_string(n.id));
    }
  }
  co_return value;
}

enum class RootStop { none, cancel, timeout };

struct Root {
  Node tree;
  RootStop stop = RootStop::none;
  int stop_ms = 0;
};

// What the program's own thread does to the pool while the roots run.
enum class ActionKind { pause, resize, wait_idle };
struct Action {
  ActionKind kind = ActionKind::wait_idle;
  int n = 0;  // pause: ms before resume(); resize: max_workers
};

struct Program {
  std::size_t workers = 2;
  std::size_t queue = 1024;
  bool caller_runs = false;        // Overflow::caller_runs, else block
  std::size_t overload_limit = 0;  // the controller on, its limit at most this; 0: off
  bool timed = false;              // PoolOptions::time_tasks
  std::vector<Root> roots;
  std::vector<Action> actions;
  ShutdownMode end = ShutdownMode::drain;
};

// How many fork steps the tree has, and whether a forked child sleeps.
void count_forks(const Node& n, bool in_fork, int& forks, bool& sleeps_in_fork) {
  for (const Step& s : n.steps) {
    if (s.kind == StepKind::fork) ++forks;
    if (s.kind == StepKind::sleep && in_fork) sleeps_in_fork = true;
    for (const Node& k : s.kids) {
      count_forks(k, in_fork || s.kind == StepKind::fork, forks, sleeps_in_fork);
    }
  }
}

std::string describe(const Program& p) {
  std::ostringstream os;
  os << "workers " << p.workers << ", queue " << p.queue
     << (p.caller_runs ? " (caller_runs)" : " (block)");
  if (p.overload_limit != 0)
    os << ", overload controller (limit at most " << p.overload_limit << ")";
  os << (p.timed ? ", timed" : "") << ", shutdown "
     << (p.end == ShutdownMode::drain  ? "drain"
         : p.end == ShutdownMode::soft ? "soft"
                                       : "hard")
     << '\n';
  for (const Root& r : p.roots) {
    os << "root"
       << (r.stop == RootStop::cancel    ? " cancelled after "
           : r.stop == RootStop::timeout ? " timeout "
                                         : "")
       << (r.stop != RootStop::none ? std::to_string(r.stop_ms) + " ms" : "") << '\n';
    show(os, r.tree, 2);
  }
  for (const Action& a : p.actions) {
    os << (a.kind == ActionKind::pause    ? "pause, resume after "
           : a.kind == ActionKind::resize ? "resize to "
                                          : "wait_idle")
       << (a.kind != ActionKind::wait_idle ? std::to_string(a.n) : "")
       << (a.kind == ActionKind::pause ? " ms" : "") << '\n';
  }
  return os.str();
}

// A failing check of a program: RapidCheck reports the smallest program it
// shrank to and the last run's description; a failure that does not happen
// on every run (a race) is printed here too, the first time, whole.
std::atomic<bool> g_printed{false};

void check(bool ok, const char* what, const std::string& log) {
  if (ok) return;
  if (!g_printed.exchange(true)) {
    std::cerr << "first failed check: " << what << "\n" << log << std::flush;
  }
  RC_LOG() << log;
  RC_FAIL(what);
}
#define MODEL_CHECK(cond) check((cond), #cond, log.str())

void run_program() {
  Program p;
  p.workers = static_cast<std::size_t>(*rc::gen::inRange(1, 4));
  p.queue = *rc::gen::element<std::size_t>(2, 8, 1024);
  p.caller_runs = *rc::gen::arbitrary<bool>();
  if (*rc::gen::arbitrary<bool>()) p.overload_limit = *rc::gen::element<std::size_t>(2, 3);
  p.timed = *rc::gen::arbitrary<bool>();
  int next_id = 1;
  // With the controller on, up to 5 roots: more than its limit at once.
  const int roots = *rc::gen::inRange(1, p.overload_limit != 0 ? 6 : 4);
  for (int i = 0; i < roots; ++i) {
    Root r;
    r.tree = gen_node(3, next_id);
    const int stop = *rc::gen::inRange(0, 4);
    r.stop = stop == 1 ? RootStop::cancel : stop == 2 ? RootStop::timeout : RootStop::none;
    r.stop_ms = *rc::gen::inRange(0, 8);
    p.roots.push_back(std::move(r));
  }
  const int actions = *rc::gen::inRange(0, 3);
  for (int i = 0; i < actions; ++i) {
    Action a;
    const int kind = *rc::gen::inRange(0, 3);
    a.kind = kind == 0 ? ActionKind::pause : kind == 1 ? ActionKind::resize : ActionKind::wait_idle;
    a.n = a.kind == ActionKind::pause ? *rc::gen::inRange(0, 5) : *rc::gen::inRange(1, 4);
    p.actions.push_back(a);
  }
  const int end = *rc::gen::inRange(0, 5);
  p.end = end == 3 ? ShutdownMode::soft : end == 4 ? ShutdownMode::hard : ShutdownMode::drain;
  std::ostringstream log;
  log << describe(p);

  FrameGuard::reset();
  std::atomic<int> handled{0};
  struct {
    std::mutex mu;
    std::vector<std::string> whats;
  } reported;
  std::vector<Task<long>> handles;
  std::vector<Eval> expected;
  PoolStats stats;
  {
    PoolOptions o = test::fixed_workers("model", p.workers);
    o.min_workers = 1;  // up to p.workers on demand; resize() moves the maximum
    o.queue_capacity = p.queue;
    o.overflow = p.caller_runs ? Overflow::caller_runs : Overflow::block;
    o.abandon_grace = 100ms;
    o.time_tasks = p.timed;
    if (p.overload_limit != 0) {
      o.overload = {.enabled = true, .target = 1ms, .interval = 10ms, .admit_coroutines = true};
      // At most the default ceiling (the queue plus the workers).
      o.overload.max_limit = std::min(p.overload_limit, p.queue + p.workers);
    }
    o.on_exception = [&handled, &reported](const TaskRef&, std::exception_ptr e) {
      handled.fetch_add(1);
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        const std::lock_guard lock(reported.mu);
        reported.whats.emplace_back(x.what());
      }
    };
    Pool pool(o);
    for (const Root& r : p.roots) {
      expected.push_back(eval(r.tree));
      TaskOptions to;
      to.name = "root";
      if (r.stop == RootStop::timeout) to.timeout = std::chrono::milliseconds(r.stop_ms + 1);
      handles.push_back(spawn(pool, run_node(pool, r.tree), std::move(to)));
    }
    for (std::size_t i = 0; i < p.roots.size(); ++i) {
      if (p.roots[i].stop != RootStop::cancel) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(p.roots[i].stop_ms));
      (void)handles[i].cancel();
    }
    for (const Action& a : p.actions) {
      switch (a.kind) {
        case ActionKind::pause:
          pool.pause();
          std::this_thread::sleep_for(std::chrono::milliseconds(a.n));
          pool.resume();
          break;
        case ActionKind::resize:
          pool.resize(static_cast<std::size_t>(a.n));
          break;
        case ActionKind::wait_idle: {
          // Waits for the suspended coroutine tasks too: once idle, every
          // root has ended.
          const bool idle = pool.wait_idle(std::chrono::seconds(10 * test::kSlowdown));
          MODEL_CHECK(idle);
          for (const Task<long>& h : handles) MODEL_CHECK(h.ready());
          break;
        }
      }
    }
    // Let the roots run a little before a soft or hard end.
    if (p.end != ShutdownMode::drain) std::this_thread::sleep_for(3ms);
    const ShutdownReport report = pool.shutdown(p.end, 0ns);
    MODEL_CHECK(report.final_state == PoolState::stopped);
    stats = pool.stats();
    // A ticket goes back just after its task's outcome is published.
    MODEL_CHECK(test::eventually([&pool] { return pool.stats().overload.admitted == 0; }));
  }
  log << "frames alive " << FrameGuard::alive() << ", submitted " << stats.submitted
      << ", outcomes " << stats.outcomes.total() << ", handled " << handled.load() << '\n';
  for (const std::string& w : reported.whats) log << "  handler: " << w << '\n';
  MODEL_CHECK(FrameGuard::alive() == 0);  // no frame outlives the pool
  MODEL_CHECK(stats.outcomes.total() == stats.submitted);

  bool any_stop = p.end != ShutdownMode::drain;
  int detached_throws = 0;
  bool refused = false;
  for (std::size_t i = 0; i < handles.size(); ++i) {
    Task<long>& h = handles[i];
    const Eval& want = expected[i];
    const TaskStatus st = h.status();
    log << "root " << i << ": " << to_string(st) << ", model "
        << (want.throws ? "throws" : std::to_string(want.value)) << '\n';
    MODEL_CHECK(h.ready());
    const RootStop stop = p.roots[i].stop;
    any_stop = any_stop || stop != RootStop::none;
    detached_throws += want.detached_throws;
    const TaskStatus model = want.throws ? TaskStatus::failed : TaskStatus::succeeded;
    const bool stopped_outcome = (stop == RootStop::cancel && st == TaskStatus::cancelled) ||
                                 (stop == RootStop::timeout && st == TaskStatus::timed_out) ||
                                 (p.end != ShutdownMode::drain && st == TaskStatus::cancelled);
    // The controller may refuse a root at its spawn; it never sheds one.
    MODEL_CHECK(st != TaskStatus::shed);
    bool overloaded = false;
    if (st == TaskStatus::rejected && h.reason() == Errc::rejected) {
      try {
        (void)h.get();
      } catch (const Error& e) {
        overloaded = e.admission() == Admission::overloaded;
      }
    }
    MODEL_CHECK(!overloaded || p.overload_limit != 0);
    any_stop = any_stop || overloaded;  // its detached children never came
    refused = refused || overloaded;
    MODEL_CHECK(st == model || stopped_outcome || overloaded);
    if (!p.timed) MODEL_CHECK(h.queue_wait() == 0ns && h.run_time() == 0ns);
    if (st == TaskStatus::succeeded) MODEL_CHECK(h.get() == want.value);
    MODEL_CHECK(h.status() == st);  // final: it never changes
  }
  RC_CLASSIFY(refused, "the controller refused a root");
  int forks = 0;
  bool sleeps_in_fork = false;
  for (const Root& r : p.roots) count_forks(r.tree, false, forks, sleeps_in_fork);
  RC_CLASSIFY(forks > 0, "a root forked children");
  RC_CLASSIFY(sleeps_in_fork, "a forked child slept (Errc::wait_in_fork)");
  // A when_all that failed cancels its other children, and with them the
  // detached tasks they would have spawned.
  bool when_all_failed = false;
  for (const Eval& e : expected) when_all_failed = when_all_failed || e.when_all_failed;
  MODEL_CHECK(handled.load() <= detached_throws);
  if (!any_stop && !when_all_failed) MODEL_CHECK(handled.load() == detached_throws);
}

// Programs per run without RC_PARAMS: well under a minute on two cores in
// each build (the sanitizers run each program ~5x slower).
constexpr int kPrograms = test::kSlowdown == 1 ? 300 : 100;

TEST(CoroModel, RandomProgramsKeepEveryPromise) {
  // Each program sleeps at most a few tens of ms; the watchdog bounds
  // generation, shrinking a failure, and a program that hangs.
  test::check_random_programs("CoroModel/RandomProgramsKeepEveryPromise",
                              test::random_program_params(kPrograms), std::chrono::seconds(120),
                              [] { run_program(); });
}

}  // namespace
}  // namespace crew
