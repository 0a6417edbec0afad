// tests/pool/pool_model.hpp: a model of crew's contracts and the commands of the
// random programs that tests/pool/model_test.cpp checks against it (RapidCheck's
// stateful testing), also replayed by hand in tests/model_regression_test.cpp.
//
// A program builds a pool and runs a sequence of commands on it: post,
// submit, cancel and get of a handle, group submit / wait / cancel,
// run_batch, pause, resume, resize, stop_worker, wait_idle, shutdown and
// restart. Its tasks return, throw, sleep, spin, wait for their stop token,
// ignore it (until released or kStubbornFor), or submit further tasks (into
// the pool, into their own group, or a subtask they wait for).
//
// The model (Rec, one per task, Sut's bookkeeping) knows which outcomes a
// task may legally have; after every command Sut::check() compares:
// - each callable runs at most once, never after the wait that covers it
//   returned; such a wait finds it not running and its captures destroyed;
// - a handle's status is final once, never changes, and fits what the
//   callable did (a task that never started is cancelled or rejected, ...);
// - outcomes.total() <= submitted always; equal, and within the model's
//   count of submissions, once the pool is quiescent; never below the
//   tasks whose end the program has already seen;
// - a group's stats after wait(): nothing pending, one outcome per submit;
// - a shutdown returns within its timeout plus abandon_grace plus a slack,
//   and its report lists exactly the tasks the model says it dropped,
//   stopped or wrote off.
// Every blocking call runs on a thread of its own, bounded (kBound, or a
// shutdown's own bound): a call past it fails the program (which RapidCheck
// then shrinks); one still blocked kLate later leaves its pool behind,
// never freed, instead of hanging the test.
#pragma once

#include <rapidcheck.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crew/batch.hpp"
#include "crew/group.hpp"
#include "crew/log.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew::test::model {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// How long tasks take at most: a stubborn task ignores its stop until the
// program releases it or this passes; a cooperative one returns at its stop
// or after kCoopFor.
inline constexpr auto kStubbornFor = 100ms;
inline constexpr auto kCoopFor = 20ms;
inline constexpr auto kAbandonGrace = 30ms;
// Every blocking call of a program returns within this, or the program fails.
inline constexpr auto kBound = std::chrono::milliseconds(3000) * kSlowdown;
// A shutdown that has a timeout, or is hard, returns within timeout +
// abandon_grace + this.
inline constexpr auto kShutdownSlack = std::chrono::milliseconds(1000) * kSlowdown;
// A call past its bound is waited for this much longer: returned then, it
// was late; still blocked, it hangs.
inline constexpr auto kLate = kShutdownSlack;

// ---------------------------------------------------------------------------
// What a task does.

enum class Act : std::uint8_t {
  ret,          // returns at once
  raise,        // throws
  sleep,        // sleeps `amount` ms
  spin,         // spins `amount` x 100 us
  coop,         // long: returns at its stop, or after kCoopFor
  stubborn,     // long: ignores its stop until released, or kStubbornFor
  post_child,   // posts a child task into the pool
  group_child,  // submits a child into its own group (a post outside a group)
  fork_join,    // submits a child with a handle and get()s it
};

inline const char* to_cstr(Act a) {
  switch (a) {
    case Act::ret:
      return "ret";
    case Act::raise:
      return "raise";
    case Act::sleep:
      return "sleep";
    case Act::spin:
      return "spin";
    case Act::coop:
      return "coop";
    case Act::stubborn:
      return "stubborn";
    case Act::post_child:
      return "post_child";
    case Act::group_child:
      return "group_child";
    case Act::fork_join:
      return "fork_join";
  }
  return "?";
}

inline bool has_child(Act a) {
  return a == Act::post_child || a == Act::group_child || a == Act::fork_join;
}

struct Spec {
  Act act = Act::ret;
  bool is_long = false;
  bool named = false;
  int amount = 1;
  int timeout_ms = 0;        // a long task's execution deadline; 0: none
  int queue_timeout_ms = 0;  // 0: none
  Act child = Act::ret;      // what a child does (ret, raise or sleep)
  bool child_named = false;
};

inline std::ostream& operator<<(std::ostream& os, const Spec& s) {
  os << "{" << to_cstr(s.act);
  if (s.act == Act::sleep || s.act == Act::spin) os << " " << s.amount;
  os << (s.is_long ? " long" : " short") << (s.named ? " named" : "");
  if (s.timeout_ms != 0) os << " timeout=" << s.timeout_ms << "ms";
  if (s.queue_timeout_ms != 0) os << " queue_timeout=" << s.queue_timeout_ms << "ms";
  if (has_child(s.act)) {
    os << " child=" << to_cstr(s.child) << (s.child_named ? " named" : "");
  }
  return os << "}";
}

// A task for a submission; simple: no children (a batch's tasks).
inline rc::Gen<Spec> gen_spec(bool simple = false) {
  return rc::gen::exec([simple] {
    Spec s;
    s.act = simple ? *rc::gen::element(Act::ret, Act::raise, Act::sleep, Act::spin, Act::coop,
                                       Act::stubborn)
                   : *rc::gen::element(Act::ret, Act::raise, Act::sleep, Act::spin, Act::coop,
                                       Act::stubborn, Act::post_child, Act::group_child,
                                       Act::fork_join);
    s.is_long = s.act == Act::coop || s.act == Act::stubborn || *rc::gen::arbitrary<bool>();
    s.named = *rc::gen::arbitrary<bool>();
    s.amount = *rc::gen::inRange(1, 4);
    if (s.is_long) s.timeout_ms = *rc::gen::element(0, 0, 5);
    s.queue_timeout_ms = *rc::gen::element(0, 0, 0, 3);
    if (has_child(s.act)) {
      s.child = *rc::gen::element(Act::ret, Act::raise, Act::sleep);
      s.child_named = *rc::gen::arbitrary<bool>();
    }
    return s;
  });
}

// ---------------------------------------------------------------------------
// The model's record of one task.

enum class Owner : std::uint8_t {
  handle,        // Pool::submit from the program; Task::get waits for it
  post,          // Pool::post; only wait_idle and shutdown wait for it
  group,         // Group::submit; Group::wait waits for it
  batch,         // run_batch; its return waits for it
  child_handle,  // submitted with a handle by a task, which get()s it
};

struct Rec {
  Rec(int index, Owner o, Spec s, int g) : idx(index), owner(o), spec(s), group(g) {
    if (spec.named) name = "t" + std::to_string(idx);
  }
  const int idx;
  const Owner owner;
  const Spec spec;
  const int group;   // for Owner::group, the program's index of the group
  std::string name;  // empty: unnamed

  // Written by the threads that run, copy and submit the task.
  std::atomic<int> started{0};
  std::atomic<bool> running{false};
  std::atomic<std::thread::id> thread{};  // the thread that runs it
  std::atomic<bool> finished{false};
  std::atomic<bool> threw{false};
  std::atomic<int> live{0};               // copies of its callable alive
  std::atomic<bool> closed{false};        // the wait that covers it returned
  std::atomic<int> admission{-1};         // what its submission returned
  std::atomic<bool> known_ended{false};   // a wait or a report showed its end
  std::atomic<std::uint64_t> pool_id{0};  // a task with a handle: its id

  // The program's own notes (the driver's thread only).
  bool cancel_won = false;  // Task::cancel() returned `cancelled`
  bool cancelled = false;   // cancel() called on it (handle or group)
  bool dropped = false;     // listed as rejected by a shutdown report
  bool abandoned = false;   // listed as abandoned, or its reason says so
  bool settled = false;     // a shutdown ended it, or it had ended before
  std::uint64_t batch_id = 0;

  [[nodiscard]] std::string label() const {
    std::ostringstream os;
    os << "task " << idx << " " << spec;
    return os.str();
  }
  [[nodiscard]] bool accepted() const {
    return admission.load() == static_cast<int>(Admission::accepted);
  }
};

// Shared by the program's driver and every callable of the program.
struct Ctx {
  Pool* pool = nullptr;
  std::atomic<int> release_epoch{0};

  std::shared_ptr<Rec> add(Owner o, const Spec& s, int group) {
    const std::lock_guard lock(mu_);
    recs_.push_back(std::make_shared<Rec>(static_cast<int>(recs_.size()), o, s, group));
    return recs_.back();
  }
  std::vector<std::shared_ptr<Rec>> recs() const {
    const std::lock_guard lock(mu_);
    return recs_;
  }
  void violation(std::string what) {
    const std::lock_guard lock(mu_);
    violations_.push_back(std::move(what));
  }
  std::vector<std::string> violations() const {
    const std::lock_guard lock(mu_);
    return violations_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Rec>> recs_;
  std::vector<std::string> violations_;
};

// One copy of a task's callable: counted in its record while it lives.
class Life {
 public:
  explicit Life(std::shared_ptr<Rec> r) noexcept : r_(std::move(r)) { r_->live.fetch_add(1); }
  Life(const Life& o) noexcept : r_(o.r_) { r_->live.fetch_add(1); }
  Life(Life&& o) noexcept : r_(o.r_) { r_->live.fetch_add(1); }
  Life& operator=(const Life&) = delete;
  Life& operator=(Life&&) = delete;
  ~Life() { r_->live.fetch_sub(1); }
  [[nodiscard]] Rec& rec() const noexcept { return *r_; }

 private:
  std::shared_ptr<Rec> r_;
};

TaskOptions options_of(const Rec& r);

struct Body {
  std::shared_ptr<Ctx> ctx;
  Group* group;  // the task's group (its group_child submits there), or null
  Life life;
  void run(const std::stop_token* stop) const;
};

struct ShortBody {
  Body b;
  void operator()() const { b.run(nullptr); }
};
struct LongBody {
  Body b;
  void operator()(const TaskContext& c) const { b.run(&c.stop_token); }
};

inline TaskOptions options_of(const Rec& r) {
  TaskOptions o;
  o.name = r.name;
  o.timeout = std::chrono::milliseconds(r.spec.timeout_ms);
  o.queue_timeout = std::chrono::milliseconds(r.spec.queue_timeout_ms);
  return o;
}

// Submits `r` through `how` (a callable given the task's body), short or long.
template <class How>
decltype(auto) with_body(const std::shared_ptr<Ctx>& ctx, Group* g, const std::shared_ptr<Rec>& r,
                         How&& how) {
  if (r->spec.is_long) return how(LongBody{Body{ctx, g, Life(r)}});
  return how(ShortBody{Body{ctx, g, Life(r)}});
}

// Closes `r`: the wait that covers it returned. Its callable must not be
// running, nor have captures left (`captures`), nor start from now on.
inline std::string close_rec(Rec& r, bool captures, const char* wait) {
  std::string bad;
  if (r.running.load()) bad += r.label() + ": still running when " + wait + " returned\n";
  if (captures && r.live.load() != 0) {
    bad += r.label() + ": its callable (" + std::to_string(r.live.load()) +
           " copies) not yet destroyed when " + wait + " returned\n";
  }
  r.closed.store(true);
  r.known_ended.store(true);
  return bad;
}

inline void Body::run(const std::stop_token* stop) const {
  Rec& r = life.rec();
  if (r.started.fetch_add(1) != 0) ctx->violation(r.label() + ": its callable ran twice");
  if (r.closed.load()) ctx->violation(r.label() + ": started after the wait covering it returned");
  r.thread.store(std::this_thread::get_id());
  r.running.store(true);
  struct Leave {
    Rec& r;
    ~Leave() {
      r.finished.store(true);
      r.running.store(false);
    }
  } leave{r};
  const Clock::time_point t0 = Clock::now();
  Pool& pool = *ctx->pool;
  const auto child_spec = [&r] {
    Spec c;
    c.act = r.spec.child;
    c.named = r.spec.child_named;
    return c;
  };
  switch (r.spec.act) {
    case Act::ret:
      break;
    case Act::raise:
      r.threw.store(true);
      throw std::runtime_error("raised by " + r.label());
    case Act::sleep:
      std::this_thread::sleep_for(std::chrono::milliseconds(r.spec.amount));
      break;
    case Act::spin:
      while (Clock::now() - t0 < std::chrono::microseconds(100) * r.spec.amount) {
      }
      break;
    case Act::coop:
      while ((stop == nullptr || !stop->stop_requested()) && Clock::now() - t0 < kCoopFor) {
        std::this_thread::sleep_for(200us);
      }
      break;
    case Act::stubborn: {
      const int epoch = ctx->release_epoch.load();
      while (ctx->release_epoch.load() == epoch && Clock::now() - t0 < kStubbornFor) {
        std::this_thread::sleep_for(200us);
      }
      break;
    }
    case Act::group_child:
      if (group != nullptr) {
        Spec cs = child_spec();
        const std::shared_ptr<Rec> c = ctx->add(Owner::group, cs, r.group);
        const Admission a = with_body(ctx, group, c, [&](auto&& body) {
          return group->submit(std::move(body), options_of(*c));
        });
        c->admission.store(static_cast<int>(a));
        break;
      }
      [[fallthrough]];
    case Act::post_child: {
      const std::shared_ptr<Rec> c = ctx->add(Owner::post, child_spec(), -1);
      const Admission a = with_body(
          ctx, nullptr, c, [&](auto&& body) { return pool.post(std::move(body), options_of(*c)); });
      c->admission.store(static_cast<int>(a));
      break;
    }
    case Act::fork_join: {
      const std::shared_ptr<Rec> c = ctx->add(Owner::child_handle, child_spec(), -1);
      Task<void> h = pool.submit(ShortBody{Body{ctx, nullptr, Life(c)}}, options_of(*c));
      c->pool_id.store(h.id());
      c->admission.store(static_cast<int>(h.status() == TaskStatus::rejected && !h.ready()
                                              ? Admission::closed
                                              : Admission::accepted));
      try {
        h.get();
      } catch (...) {  // the child's exception or refusal is the child's outcome
      }
      if (c->started.load() != 0 || h.reason() != Errc::abandoned) {
        const std::string bad = close_rec(*c, /*captures=*/true, "Task::get (in a task)");
        if (!bad.empty()) ctx->violation(bad);
      }
      break;
    }
  }
}

// ---------------------------------------------------------------------------
// Blocking calls on a thread of their own.

// Runs `call` on a thread of its own and waits `limit` for it, then up to
// `late` more. Returns how long it took (its exception, if any, rethrown
// here), or nothing if it has not returned by then: the thread is left
// blocked, detached, and what `call` refers to must never be freed.
inline std::optional<std::chrono::nanoseconds> bounded(std::function<void()> call,
                                                       std::chrono::nanoseconds limit,
                                                       std::chrono::nanoseconds late = 0ns) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  auto s = std::make_shared<Shared>();
  const Clock::time_point t0 = Clock::now();
  std::thread t([s, call = std::move(call)] {
    std::exception_ptr e;
    try {
      call();
    } catch (...) {
      e = std::current_exception();
    }
    const std::lock_guard lock(s->mu);
    s->error = e;
    s->done = true;
    s->cv.notify_all();
  });
  std::unique_lock lock(s->mu);
  if (!s->cv.wait_for(lock, limit + late, [&] { return s->done; })) {
    lock.unlock();
    t.detach();
    return std::nullopt;
  }
  const std::chrono::nanoseconds took = Clock::now() - t0;
  lock.unlock();
  t.join();
  if (s->error) std::rethrow_exception(s->error);
  return took;
}

class QuietLogger final : public Logger {
 public:
  [[nodiscard]] LogLevel level() const noexcept override { return LogLevel::error; }
  void log(LogLevel, const LogContext&, std::string_view) noexcept override {}
};

// ---------------------------------------------------------------------------
// The model's static state (what RapidCheck's generator sees) and the system
// under test with the model's records.

struct Model {
  std::size_t workers = 1;  // min_workers; max_workers starts there
  bool paused = false;
  bool stopped = false;
  int handles = 0;
  int groups = 0;
};

class Sut {
 public:
  explicit Sut(std::size_t workers);
  ~Sut();
  Sut(const Sut&) = delete;
  Sut& operator=(const Sut&) = delete;

  // The checks made after every command; throws (RC_ASSERT) on a failure.
  void check(const Model& m);
  // Ends the program: shuts the pool down, waits for every group and handle,
  // destroys them and the pool, and checks what is left.
  void finish(const Model& m);

  // Runs `call` bounded by `limit`; if it hangs, the pool and everything the
  // program made are left behind and the program fails.
  void blocking(const std::string& what, std::function<void()> call,
                std::chrono::nanoseconds limit = kBound);

  // Commands' steps that other steps reuse.
  void shutdown(ShutdownMode mode, std::chrono::milliseconds timeout);
  void group_wait(int g);
  void get(int i);

  void note(const std::string& bad) {
    if (!bad.empty()) ctx->violation(bad);
  }
  void expect_no_violation();

  std::shared_ptr<Ctx> ctx = std::make_shared<Ctx>();
  std::unique_ptr<Pool> pool;
  std::vector<std::unique_ptr<Group>> groups;
  std::vector<bool> group_cancelled;
  std::shared_ptr<std::vector<Task<void>>> handles = std::make_shared<std::vector<Task<void>>>();
  std::vector<std::shared_ptr<Rec>> handle_recs;
  std::vector<TaskStatus> seen;  // per handle: the final status once seen
  bool wedged = false;
  std::string program;  // the commands, shown

 private:
  void wedge();
  void teardown();
};

inline std::string status_name(TaskStatus s) { return std::string(to_string(s)); }

// What the model allows for `r` with `status` (and `reason`): "" or why not.
inline std::string fits(const Rec& r, TaskStatus status, Errc reason) {
  if (!is_final(status)) return "";
  const int started = r.started.load();
  const bool ok = [&] {
    switch (status) {
      case TaskStatus::rejected:
        return started == 0;
      case TaskStatus::cancelled:
        return started == 0 || r.spec.is_long || reason == Errc::abandoned;
      case TaskStatus::timed_out:
        return started == 1 && r.spec.is_long && r.spec.timeout_ms != 0;
      case TaskStatus::succeeded:
        return started == 1 && r.finished.load() && !r.threw.load();
      case TaskStatus::failed:
        return started == 1 && r.finished.load() && r.threw.load();
      default:
        return false;
    }
  }();
  if (ok) return "";
  return r.label() + ": status " + status_name(status) + " (" + std::string(to_string(reason)) +
         ") but its callable started " + std::to_string(started) + "x, finished " +
         std::to_string(r.finished.load()) + ", threw " + std::to_string(r.threw.load()) + "\n";
}

inline Sut::Sut(std::size_t workers) {
  PoolOptions o = fixed_workers("model", workers);
  o.abandon_grace = kAbandonGrace;
  o.on_exception = [](const TaskRef&, std::exception_ptr) {};
  o.logger = std::make_shared<QuietLogger>();
  pool = std::make_unique<Pool>(std::move(o));
  ctx->pool = pool.get();
}

inline Sut::~Sut() {
  if (!wedged) teardown();
}

// Leaves the pool, the groups and the handles to a thread that is still
// blocked in one of them: never freed.
inline void Sut::wedge() {
  wedged = true;
  ctx->release_epoch.fetch_add(1);
  struct Left {
    std::unique_ptr<Pool> pool;
    std::vector<std::unique_ptr<Group>> groups;
    std::shared_ptr<std::vector<Task<void>>> handles;
  };
  static std::mutex mu;
  static auto* left = new std::vector<Left*>();  // reachable: not a leak to LeakSanitizer
  const std::lock_guard lock(mu);
  left->push_back(new Left{std::move(pool), std::move(groups), handles});
  // Each left-behind pool keeps its threads, and each hang costs a bound
  // (kBound + kLate: 20 s under a sanitizer): past 10, stop shrinking.
  if (left->size() > 10) {
    std::fprintf(stderr, "model: more than 10 programs hung; giving up. The last one:\n%s\n",
                 program.c_str());
    std::abort();
  }
}

inline void Sut::blocking(const std::string& what, std::function<void()> call,
                          std::chrono::nanoseconds limit) {
  const auto ms = [](std::chrono::nanoseconds d) {
    return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
  };
  // Past its bound, a call gets kLate more to tell a slow call from a hung one.
  const std::optional<std::chrono::nanoseconds> took = bounded(std::move(call), limit, kLate);
  if (!took) {
    wedge();
    RC_FAIL(what + " did not return within " + ms(limit) + " ms (nor " + ms(kLate) + " ms later)");
  }
  if (*took > limit) {
    RC_FAIL(what + " took " + ms(*took) + " ms, more than its bound of " + ms(limit) + " ms");
  }
}

// After an assertion failed mid-program: stop everything without checks.
inline void Sut::teardown() {
  ctx->release_epoch.fetch_add(1);
  if (!pool) return;  // finish() ended the program
  Pool* p = pool.get();
  bool ok = bounded([p] { (void)p->shutdown(ShutdownMode::hard, 0ns); }, kBound).has_value();
  for (auto& g : groups) {
    if (!ok) break;
    Group* raw = g.get();
    ok = bounded([raw] { raw->cancel(); }, kBound) && bounded([&g] { g.reset(); }, kBound);
  }
  if (ok) ok = bounded([this] { pool.reset(); }, kBound).has_value();
  if (!ok) wedge();
}

inline void Sut::expect_no_violation() {
  const std::vector<std::string> v = ctx->violations();
  if (v.empty()) return;
  std::string all;
  for (const std::string& s : v) all += s + (s.ends_with('\n') ? "" : "\n");
  RC_FAIL(all);
}

inline void Sut::check(const Model&) {
  expect_no_violation();
  const PoolStats st = pool->stats();
  RC_ASSERT(st.outcomes.total() <= st.submitted);
  // Handles: a final status never changes and fits what the callable did.
  for (std::size_t i = 0; i < handle_recs.size(); ++i) {
    const Task<void>& h = (*handles)[i];
    const TaskStatus s = h.status();
    if (is_final(seen[i])) {
      RC_ASSERT(s == seen[i]);
    } else if (is_final(s)) {
      seen[i] = s;
      note(fits(*handle_recs[i], s, h.reason()));
    }
  }
  // Every task whose end the program saw is counted by the pool (but group
  // submissions that were refused may have been refused by the group).
  std::uint64_t ended = 0;
  for (const auto& r : ctx->recs()) {
    if (!r->known_ended.load()) continue;
    if (r->owner == Owner::group && !r->accepted()) continue;
    if (r->owner == Owner::batch && r->batch_id == 0) continue;
    ++ended;
  }
  const PoolStats after = pool->stats();
  if (after.outcomes.total() < ended) {
    RC_FAIL("stats() counts " + std::to_string(after.outcomes.total()) +
            " outcomes, but the program has seen " + std::to_string(ended) + " tasks end");
  }
  expect_no_violation();
}

// The pool is quiescent: every submission has an outcome, and the pool
// counted as many as the model made.
inline void check_quiescent(Sut& sut) {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  for (const auto& r : sut.ctx->recs()) {
    if (r->owner == Owner::batch && r->batch_id == 0) continue;
    if (r->owner == Owner::group && !r->accepted()) {
      ++hi;  // refused by the pool (counted) or by the group (not)
      continue;
    }
    ++lo;
    ++hi;
  }
  const PoolStats st = sut.pool->stats();
  RC_ASSERT(st.submitted == st.outcomes.total());
  if (st.submitted < lo || st.submitted > hi) {
    RC_FAIL("stats().submitted is " + std::to_string(st.submitted) + "; the program made " +
            std::to_string(lo) + ".." + std::to_string(hi) + " submissions");
  }
}

inline void Sut::get(int i) {
  auto hs = handles;
  const std::size_t k = static_cast<std::size_t>(i);
  blocking("Task::get of handle " + std::to_string(i), [hs, k] {
    try {
      (*hs)[k].get();
    } catch (...) {  // the task's exception or refusal: its outcome
    }
  });
  Task<void>& h = (*handles)[k];
  Rec& r = *handle_recs[k];
  RC_ASSERT(h.ready());
  note(fits(r, h.status(), h.reason()));
  if (h.reason() == Errc::abandoned) {
    r.abandoned = true;
    r.known_ended.store(true);
  } else {
    note(close_rec(r, /*captures=*/true, "Task::get"));
  }
}

inline void Sut::group_wait(int g) {
  Group* grp = groups[static_cast<std::size_t>(g)].get();
  blocking("Group::wait of group " + std::to_string(g), [grp] { grp->wait(); });
  const GroupStats st = grp->stats();
  std::uint64_t n = 0, short_threw = 0, threw = 0, short_ok = 0, ok = 0, never = 0;
  for (const auto& r : ctx->recs()) {
    if (r->owner != Owner::group || r->group != g) continue;
    ++n;
    note(close_rec(*r, /*captures=*/true, "Group::wait"));
    const bool fin = r->finished.load();
    const bool t = r->threw.load();
    if (fin && t) {
      ++threw;
      if (!r->spec.is_long) ++short_threw;
    }
    if (fin && !t) {
      ++ok;
      if (!r->spec.is_long) ++short_ok;
    }
    if (r->started.load() == 0) ++never;
  }
  std::ostringstream os;
  os << "group " << g << " after wait(): submitted " << st.submitted << " pending " << st.pending
     << " succeeded " << st.outcomes.succeeded << " failed " << st.outcomes.failed << " cancelled "
     << st.outcomes.cancelled << " timed_out " << st.outcomes.timed_out << " rejected "
     << st.outcomes.rejected << "; the model: " << n << " submitted, " << never
     << " never started, " << ok << " returned (" << short_ok << " short), " << threw << " threw ("
     << short_threw << " short)";
  if (st.pending != 0 || st.submitted != n || st.outcomes.total() != n ||
      st.outcomes.failed < short_threw || st.outcomes.failed > threw ||
      st.outcomes.succeeded < short_ok || st.outcomes.succeeded > ok ||
      st.outcomes.cancelled + st.outcomes.rejected < never) {
    RC_FAIL(os.str());
  }
  expect_no_violation();
}

inline std::string show_ref(const TaskRef& t) {
  return "#" + std::to_string(t.id) + (t.name.empty() ? "" : " '" + t.name + "'");
}

inline void Sut::shutdown(ShutdownMode mode, std::chrono::milliseconds timeout) {
  // Before: the handles whose outcome is not decided yet.
  std::vector<bool> open(handle_recs.size());
  for (std::size_t i = 0; i < handle_recs.size(); ++i) open[i] = !(*handles)[i].ready();
  auto out = std::make_shared<ShutdownReport>();
  Pool* p = pool.get();
  const bool bounded_mode = mode == ShutdownMode::hard || timeout.count() != 0;
  const auto limit = bounded_mode ? (mode == ShutdownMode::hard ? 0ms : timeout) + kAbandonGrace +
                                        std::chrono::milliseconds(kShutdownSlack)
                                  : std::chrono::milliseconds(kBound);
  const Clock::time_point t0 = Clock::now();
  blocking(
      "shutdown(" + std::string(to_string(mode)) + ", " + std::to_string(timeout.count()) + " ms)",
      [p, out, mode, timeout] { *out = p->shutdown(mode, timeout); }, limit);
  const auto took = Clock::now() - t0;
  const ShutdownReport& rep = *out;

  std::ostringstream why;
  const auto bad = [&why](const std::string& s) { why << s << "\n"; };
  if (rep.final_state != PoolState::stopped && rep.final_state != PoolState::stopped_timeout) {
    bad("final_state " + std::string(to_string(rep.final_state)));
  }
  if (pool->state() != rep.final_state) bad("state() differs from the report's final_state");
  if (rep.escalated && (mode == ShutdownMode::hard || timeout.count() == 0)) {
    bad("escalated without a timeout");
  }

  // Who the report names: a handle by its id, a named task by its name.
  std::vector<std::shared_ptr<Rec>> recs = ctx->recs();
  const auto find = [&](const TaskRef& t) -> Rec* {
    for (std::size_t i = 0; i < handle_recs.size(); ++i) {
      if ((*handles)[i].id() == t.id && t.id != 0) return handle_recs[i].get();
    }
    for (const auto& r : recs) {
      if ((t.id != 0 && r->pool_id.load() == t.id) || (!t.name.empty() && r->name == t.name)) {
        return r.get();
      }
    }
    return nullptr;
  };
  std::set<const Rec*> in_rejected, in_cancelled, in_abandoned, in_timed_out;
  std::uint64_t unknown_rejected = 0;
  const auto collect = [&](const std::vector<TaskRef>& list, std::set<const Rec*>& into,
                           const char* what, std::uint64_t* unknown) {
    for (const TaskRef& t : list) {
      Rec* r = find(t);
      if (r == nullptr) {
        if (t.name.empty() && unknown != nullptr) {
          ++*unknown;  // an unnamed task without a handle
        } else if (!t.name.empty()) {
          bad(std::string("report.") + what + " names " + show_ref(t) + ", which is no task's");
        }
        continue;
      }
      if (!into.insert(r).second)
        bad(std::string("report.") + what + " lists " + r->label() + " twice");
    }
  };
  collect(rep.rejected, in_rejected, "rejected", &unknown_rejected);
  collect(rep.cancelled, in_cancelled, "cancelled", nullptr);
  collect(rep.abandoned, in_abandoned, "abandoned", nullptr);
  collect(rep.timed_out, in_timed_out, "timed_out", nullptr);

  for (const Rec* r : in_rejected) {
    if (r->dropped) bad(r->label() + ": in report.rejected of two shutdowns");
    if (r->started.load() != 0) bad(r->label() + ": in report.rejected but its callable ran");
    if (in_cancelled.count(r) || in_abandoned.count(r)) bad(r->label() + ": in two lists");
  }
  for (const Rec* r : in_cancelled) {
    if (!r->spec.is_long) bad(r->label() + ": a short task in report.cancelled");
  }

  // Handles: the report lists exactly those whose outcome this shutdown decided.
  for (std::size_t i = 0; i < handle_recs.size(); ++i) {
    Rec* r = handle_recs[i].get();
    const Task<void>& h = (*handles)[i];
    if (!open[i]) {
      if (in_rejected.count(r) || in_cancelled.count(r) || in_abandoned.count(r)) {
        bad(r->label() + ": listed, but its outcome was decided before the shutdown");
      }
      continue;
    }
    if (!h.ready()) {
      if (!(h.status() == TaskStatus::running && r->spec.act == Act::stubborn)) {
        bad(r->label() + ": no outcome after the shutdown returned (" + status_name(h.status()) +
            ")");
      }
      continue;
    }
    const bool dropped = h.status() == TaskStatus::rejected && h.reason() == Errc::shutdown_dropped;
    if (dropped != (in_rejected.count(r) != 0)) {
      bad(r->label() + ": ended " + status_name(h.status()) + " (" +
          std::string(to_string(h.reason())) + "), " + (dropped ? "not " : "") +
          "in report.rejected");
    }
    const bool abandoned = h.reason() == Errc::abandoned;
    // A task asked to stop before the shutdown (its deadline, a cancel) is
    // written off a grace after that request, which may fall between the
    // snapshot above and the pool's start of the shutdown: then no report
    // lists it.
    const bool stop_asked_before = r->spec.timeout_ms != 0 || r->cancelled;
    const bool listed = in_abandoned.count(r) != 0;
    if (abandoned != listed && !(abandoned && stop_asked_before)) {
      bad(r->label() + ": reason " + std::string(to_string(h.reason())) + ", " +
          (abandoned ? "not " : "") + "in report.abandoned");
    }
    if (h.status() == TaskStatus::cancelled && !abandoned && h.reason() == Errc::cancelled &&
        r->started.load() != 0 && !r->cancelled && in_cancelled.count(r) == 0) {
      bad(r->label() + ": stopped by the shutdown, not in report.cancelled");
    }
  }
  // Tasks without a handle: the model knows one was dropped when it was
  // accepted and never started; whether a task of a cancelled group, or one
  // with a queue deadline, was dropped or ended otherwise it cannot say.
  std::uint64_t must = 0, may = 0;
  std::vector<std::string> missing;
  for (const auto& r : recs) {
    if (r->owner != Owner::post && r->owner != Owner::group && r->owner != Owner::child_handle) {
      continue;
    }
    if (!r->accepted() || r->settled || r->started.load() != 0) continue;
    // A subtask's parent may have ended it (its wait runs it, or it was
    // refused) before the shutdown.
    const bool unsure =
        r->spec.queue_timeout_ms != 0 || r->owner == Owner::child_handle ||
        (r->owner == Owner::group && group_cancelled[static_cast<std::size_t>(r->group)]);
    if (unsure) {
      ++may;
      continue;
    }
    ++must;
    if (!r->name.empty() && in_rejected.count(r.get()) == 0) missing.push_back(r->label());
  }
  for (const std::string& s : missing) bad(s + ": dropped by the shutdown, not in report.rejected");
  std::uint64_t listed_no_handle = unknown_rejected + rep.rejected_unnamed;
  for (const Rec* r : in_rejected) {
    if (r->owner == Owner::post || r->owner == Owner::group || r->owner == Owner::child_handle) {
      ++listed_no_handle;
    }
  }
  if (listed_no_handle < must || listed_no_handle > must + may) {
    bad("report: " + std::to_string(listed_no_handle) +
        " tasks without a handle rejected (listed or rejected_unnamed); the model: " +
        std::to_string(must) + ".." + std::to_string(must + may));
  }

  // Closing: no task runs any more but one that may have been written off.
  // An unnamed task without a handle written off is only counted
  // (abandoned_unnamed): that many such tasks may still run.
  std::uint64_t unnamed_written_off = rep.abandoned_unnamed;
  // A written-off thread also holds the tasks nested in the waits of the one
  // it was written off with (a waiting task runs queued ones): they may run
  // on too.
  std::set<std::thread::id> written_off_threads;
  for (const auto& r : recs) {
    if (in_abandoned.count(r.get()) && r->running.load()) {
      written_off_threads.insert(r->thread.load());
    }
  }
  for (const auto& r : recs) {
    if (in_rejected.count(r.get())) r->dropped = true;
    if (in_abandoned.count(r.get())) r->abandoned = true;
    r->settled = true;  // every task submitted so far has its outcome now
    if (r->owner == Owner::batch || r->owner == Owner::child_handle) continue;
    const bool may_run_on = r->abandoned || r->spec.act == Act::stubborn;
    if (may_run_on || (r->owner == Owner::group && !r->accepted())) continue;
    if (r->running.load() && written_off_threads.count(r->thread.load()) != 0) {
      r->abandoned = true;
      continue;
    }
    if (r->running.load() && r->name.empty() && r->owner != Owner::handle &&
        unnamed_written_off > 0) {
      --unnamed_written_off;
      r->abandoned = true;
      continue;
    }
    if (r->running.load()) bad(r->label() + ": still running when shutdown() returned");
    r->closed.store(true);
    if (r->accepted()) r->known_ended.store(true);
  }
  // What the programs reached, shown as RapidCheck's distribution.
  RC_CLASSIFY(!rep.rejected.empty() || rep.rejected_unnamed != 0, "a shutdown dropped tasks");
  RC_CLASSIFY(!rep.cancelled.empty(), "a shutdown stopped tasks");
  RC_CLASSIFY(!rep.abandoned.empty() || rep.abandoned_unnamed != 0, "a shutdown wrote tasks off");
  RC_CLASSIFY(rep.escalated, "a shutdown escalated");
  const std::string w = why.str();
  if (!w.empty()) {
    std::ostringstream all;
    all << w << "report: rejected";
    for (const auto& t : rep.rejected) all << " " << show_ref(t);
    all << " (+" << rep.rejected_unnamed << " unnamed); cancelled";
    for (const auto& t : rep.cancelled) all << " " << show_ref(t);
    all << "; abandoned";
    for (const auto& t : rep.abandoned) all << " " << show_ref(t);
    all << " (+" << rep.abandoned_unnamed << " unnamed); timed_out";
    for (const auto& t : rep.timed_out) all << " " << show_ref(t);
    all << "; escalated " << rep.escalated << ", took "
        << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
    RC_FAIL(all.str());
  }
  if (rep.abandoned_unnamed == 0 && rep.abandoned.empty()) check_quiescent(*this);
  expect_no_violation();
}

// ---------------------------------------------------------------------------
// Commands.

using Command = rc::state::Command<Model, Sut>;

struct Post final : Command {
  Spec spec = *gen_spec();
  void run(const Model& m, Sut& sut) const override {
    const auto r = sut.ctx->add(Owner::post, spec, -1);
    Pool& p = *sut.pool;
    const Admission a = with_body(
        sut.ctx, nullptr, r, [&](auto&& body) { return p.post(std::move(body), options_of(*r)); });
    r->admission.store(static_cast<int>(a));
    RC_ASSERT(a == (m.stopped ? Admission::closed : Admission::accepted));
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "post " << spec; }
};

struct Submit final : Command {
  Spec spec = *gen_spec();
  void apply(Model& m) const override { ++m.handles; }
  void run(const Model& m, Sut& sut) const override {
    const auto r = sut.ctx->add(Owner::handle, spec, -1);
    Pool& p = *sut.pool;
    Task<void> h = with_body(sut.ctx, nullptr, r, [&](auto&& body) {
      return p.submit(std::move(body), options_of(*r));
    });
    const bool refused = h.status() == TaskStatus::rejected && h.reason() == Errc::rejected;
    r->admission.store(static_cast<int>(refused ? Admission::closed : Admission::accepted));
    RC_ASSERT(refused == m.stopped);
    r->pool_id.store(h.id());
    sut.handles->push_back(std::move(h));
    sut.handle_recs.push_back(r);
    sut.seen.push_back(TaskStatus::queued);
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "submit (the next handle) " << spec; }
};

struct Cancel final : Command {
  explicit Cancel(const Model& m) : i(*rc::gen::inRange(0, std::max(1, m.handles))) {}
  int i;
  void checkPreconditions(const Model& m) const override { RC_PRE(i < m.handles); }
  void run(const Model& m, Sut& sut) const override {
    const std::size_t k = static_cast<std::size_t>(i);
    Rec& r = *sut.handle_recs[k];
    Task<void>& h = (*sut.handles)[k];
    r.cancelled = true;
    const CancelResult res = h.cancel();
    switch (res) {
      case CancelResult::cancelled:
        r.cancel_won = true;
        RC_ASSERT(h.status() == TaskStatus::cancelled);
        break;
      case CancelResult::stop_requested:
        RC_ASSERT(r.spec.is_long);
        break;
      case CancelResult::not_interruptible:
        RC_ASSERT(!r.spec.is_long);
        break;
      case CancelResult::already_finished:
        RC_ASSERT(h.ready());
        break;
    }
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "cancel handle " << i; }
};

struct Get final : Command {
  explicit Get(const Model& m) : i(*rc::gen::inRange(0, std::max(1, m.handles))) {}
  int i;
  void checkPreconditions(const Model& m) const override { RC_PRE(i < m.handles && !m.paused); }
  void run(const Model& m, Sut& sut) const override {
    sut.get(i);
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "get handle " << i; }
};

struct NewGroup final : Command {
  void checkPreconditions(const Model& m) const override { RC_PRE(m.groups < 3); }
  void apply(Model& m) const override { ++m.groups; }
  void run(const Model& m, Sut& sut) const override {
    sut.groups.push_back(std::make_unique<Group>(*sut.pool));
    sut.group_cancelled.push_back(false);
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "new group"; }
};

struct GroupSubmit final : Command {
  explicit GroupSubmit(const Model& m) : g(*rc::gen::inRange(0, std::max(1, m.groups))) {}
  int g;
  Spec spec = *gen_spec();
  void checkPreconditions(const Model& m) const override { RC_PRE(g < m.groups); }
  void run(const Model& m, Sut& sut) const override {
    const std::size_t k = static_cast<std::size_t>(g);
    Group* grp = sut.groups[k].get();
    const auto r = sut.ctx->add(Owner::group, spec, g);
    const Admission a = with_body(
        sut.ctx, grp, r, [&](auto&& body) { return grp->submit(std::move(body), options_of(*r)); });
    r->admission.store(static_cast<int>(a));
    RC_ASSERT(a == (m.stopped || sut.group_cancelled[k] ? Admission::closed : Admission::accepted));
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "group " << g << " submit " << spec; }
};

struct GroupWait final : Command {
  explicit GroupWait(const Model& m) : g(*rc::gen::inRange(0, std::max(1, m.groups))) {}
  int g;
  void checkPreconditions(const Model& m) const override { RC_PRE(g < m.groups && !m.paused); }
  void run(const Model& m, Sut& sut) const override {
    sut.group_wait(g);
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "group " << g << " wait"; }
};

struct GroupCancel final : Command {
  explicit GroupCancel(const Model& m) : g(*rc::gen::inRange(0, std::max(1, m.groups))) {}
  int g;
  void checkPreconditions(const Model& m) const override { RC_PRE(g < m.groups); }
  void run(const Model& m, Sut& sut) const override {
    const std::size_t k = static_cast<std::size_t>(g);
    sut.groups[k]->cancel();
    sut.group_cancelled[k] = true;
    for (const auto& r : sut.ctx->recs()) {
      if (r->owner == Owner::group && r->group == g) r->cancelled = true;
    }
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "group " << g << " cancel"; }
};

struct Batch final : Command {
  bool is_long = *rc::gen::arbitrary<bool>();
  std::vector<Spec> specs = *rc::gen::container<std::vector<Spec>>(
      static_cast<std::size_t>(*rc::gen::inRange(1, 5)), gen_spec(/*simple=*/true));
  int timeout_ms = *rc::gen::element(0, 0, 5);
  void checkPreconditions(const Model& m) const override { RC_PRE(!m.paused); }

  template <class B>
  void go(const Model& m, Sut& sut) const {
    std::vector<std::shared_ptr<Rec>> recs;
    auto bodies = std::make_shared<std::vector<B>>();
    for (Spec s : specs) {
      s.is_long = is_long;
      s.named = false;  // the batch's options name its tasks
      if (!is_long && (s.act == Act::coop || s.act == Act::stubborn)) s.act = Act::sleep;
      s.timeout_ms = is_long ? s.timeout_ms : 0;
      s.queue_timeout_ms = 0;
      recs.push_back(sut.ctx->add(Owner::batch, s, -1));
      bodies->push_back(B{Body{sut.ctx, nullptr, Life(recs.back())}});
    }
    auto result = std::make_shared<BatchResult<void>>();
    Pool* p = sut.pool.get();
    const std::chrono::nanoseconds timeout = std::chrono::milliseconds(timeout_ms);
    // Braced options: clang 14 rejects a named BatchOptions there (it
    // substitutes it into the (range, fn) overload's return type).
    sut.blocking("run_batch", [p, bodies, result, timeout] {
      *result = run_batch(*p, *bodies, {.timeout = timeout});
    });
    bodies->clear();  // the range is read in place: its elements are the program's
    RC_ASSERT(result->outcomes.size() == recs.size());
    for (std::size_t i = 0; i < recs.size(); ++i) {
      Rec& r = *recs[i];
      const Outcome<void>& o2 = result->outcomes[i];
      r.batch_id = o2.id;
      sut.note(fits(r, o2.status, o2.reason));
      if (m.stopped) RC_ASSERT(o2.status == TaskStatus::rejected);
      if (o2.reason == Errc::abandoned) {
        r.abandoned = true;
        r.known_ended.store(true);
      }
      sut.note(close_rec(r, /*captures=*/true, "run_batch"));
    }
  }
  void run(const Model& m, Sut& sut) const override {
    if (is_long) {
      go<LongBody>(m, sut);
    } else {
      go<ShortBody>(m, sut);
    }
    sut.check(m);
  }
  void show(std::ostream& os) const override {
    os << "run_batch" << (is_long ? " long" : " short");
    if (timeout_ms != 0) os << " timeout=" << timeout_ms << "ms";
    for (const Spec& s : specs) os << " " << s;
  }
};

struct Pause final : Command {
  void checkPreconditions(const Model& m) const override { RC_PRE(!m.paused && !m.stopped); }
  void apply(Model& m) const override { m.paused = true; }
  void run(const Model& m, Sut& sut) const override {
    sut.pool->pause();
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "pause"; }
};

struct Resume final : Command {
  void checkPreconditions(const Model& m) const override { RC_PRE(m.paused); }
  void apply(Model& m) const override { m.paused = false; }
  void run(const Model& m, Sut& sut) const override {
    sut.pool->resume();
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "resume"; }
};

struct Resize final : Command {
  std::size_t extra = static_cast<std::size_t>(*rc::gen::inRange(0, 3));
  void run(const Model& m, Sut& sut) const override {
    sut.pool->resize(m.workers + extra);
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "resize min+" << extra; }
};

struct StopWorker final : Command {
  std::size_t which = static_cast<std::size_t>(*rc::gen::inRange(0, 4));
  bool hard = *rc::gen::arbitrary<bool>();
  void run(const Model& m, Sut& sut) const override {
    if (hard) {  // the worker's long task, whichever it is, has its token stopped
      for (const auto& r : sut.ctx->recs()) {
        if (r->spec.is_long && !r->finished.load()) r->cancelled = true;
      }
    }
    const std::vector<WorkerInfo> ws = sut.pool->workers();
    if (!ws.empty()) {
      (void)sut.pool->stop_worker(ws[which % ws.size()].id,
                                  hard ? WorkerStop::hard : WorkerStop::graceful);
    }
    sut.check(m);
  }
  void show(std::ostream& os) const override {
    os << "stop_worker " << which << (hard ? " hard" : " graceful");
  }
};

struct WaitIdle final : Command {
  void checkPreconditions(const Model& m) const override { RC_PRE(!m.paused); }
  void run(const Model& m, Sut& sut) const override {
    Pool* p = sut.pool.get();
    auto idle = std::make_shared<bool>(false);
    sut.blocking("wait_idle", [p, idle] { *idle = p->wait_idle(kBound); });
    RC_ASSERT(*idle);
    bool abandoned_plain = false;
    for (const auto& r : sut.ctx->recs()) {
      if (r->owner == Owner::batch || r->owner == Owner::child_handle) continue;
      if (r->abandoned || r->spec.act == Act::stubborn) {
        abandoned_plain = abandoned_plain || r->owner == Owner::post;
        continue;
      }
      if (r->owner == Owner::group && !r->accepted()) continue;
      sut.note(close_rec(*r, /*captures=*/false, "wait_idle"));
    }
    if (!abandoned_plain) check_quiescent(sut);
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "wait_idle"; }
};

struct Shutdown final : Command {
  ShutdownMode mode =
      *rc::gen::element(ShutdownMode::drain, ShutdownMode::soft, ShutdownMode::hard);
  int timeout_ms = *rc::gen::element(0, 2, 20);
  void checkPreconditions(const Model& m) const override { RC_PRE(!m.stopped); }
  void apply(Model& m) const override {
    m.stopped = true;
    m.paused = false;
  }
  void run(const Model& m, Sut& sut) const override {
    sut.shutdown(mode, std::chrono::milliseconds(timeout_ms));
    sut.check(m);
  }
  void show(std::ostream& os) const override {
    os << "shutdown(" << to_string(mode) << ", " << timeout_ms << " ms)";
  }
};

struct Restart final : Command {
  void checkPreconditions(const Model& m) const override { RC_PRE(m.stopped); }
  void apply(Model& m) const override { m.stopped = false; }
  void run(const Model& m, Sut& sut) const override {
    RC_ASSERT(sut.pool->restart());
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "restart"; }
};

struct Release final : Command {
  void run(const Model& m, Sut& sut) const override {
    sut.ctx->release_epoch.fetch_add(1);
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "release stubborn tasks"; }
};

inline void Sut::finish(const Model& m) {
  if (!m.stopped) shutdown(ShutdownMode::drain, 0ms);
  // Written-off tasks may still run: let them go, and wait for them.
  ctx->release_epoch.fetch_add(1);
  const auto all_returned = [this] {
    for (const auto& r : ctx->recs()) {
      if (r->running.load()) return false;
    }
    return true;
  };
  RC_ASSERT(
      eventually(all_returned, std::chrono::duration_cast<std::chrono::milliseconds>(kBound)));
  for (std::size_t g = 0; g < groups.size(); ++g) group_wait(static_cast<int>(g));
  for (std::size_t i = 0; i < handle_recs.size(); ++i) get(static_cast<int>(i));
  check(m);
  check_quiescent(*this);
  blocking("~Group", [this] { groups.clear(); });
  blocking("~Pool", [this] { pool.reset(); });
  handles->clear();
  for (const auto& r : ctx->recs()) {
    if (r->started.load() > 1) note(r->label() + ": its callable ran twice");
    if (r->cancel_won && r->started.load() != 0) note(r->label() + ": ran after cancel() won");
    if (r->dropped && r->started.load() != 0)
      note(r->label() + ": ran after a shutdown dropped it");
    if (r->live.load() != 0) {
      note(r->label() + ": " + std::to_string(r->live.load()) +
           " copies of its callable alive after ~Pool returned and its handle was released");
    }
  }
  expect_no_violation();
}

// The commands a program is made of; a command listed twice comes twice as
// often.
inline auto gen_command() {
  return rc::state::gen::execOneOfWithArgs<Post, Submit, Submit, Cancel, Get, Get, NewGroup,
                                           GroupSubmit, GroupSubmit, GroupSubmit, GroupWait,
                                           GroupCancel, Batch, Pause, Resume, Resize, StopWorker,
                                           WaitIdle, Shutdown, Restart, Release>();
}

// One random program: a pool of 1-3 workers, a sequence of commands, and
// the end (Sut::finish).
inline void run_program() {
  Model m;
  m.workers = static_cast<std::size_t>(*rc::gen::inRange(1, 4));
  const auto cmds = *rc::state::gen::commands(m, gen_command());
  try {
    Sut sut(m.workers);
    std::ostringstream shown;
    rc::show(cmds, shown);
    sut.program = shown.str();
    rc::state::runAll(cmds, m, sut);
    Model end = m;
    rc::state::applyAll(cmds, end);
    sut.finish(end);
  } catch (const rc::detail::CaseResult& r) {
    // The first failing program of the run always, and with CREW_MODEL_LOG=1
    // every one, before and while it shrinks: a failure that does not recur
    // when shrunk (a timing one) is reported only here.
    static std::atomic<bool> shown_first{false};
    if (r.type == rc::detail::CaseResult::Type::Failure &&
        (!shown_first.exchange(true) || std::getenv("CREW_MODEL_LOG") != nullptr)) {
      std::ostringstream os;
      rc::show(cmds, os);
      std::fprintf(stderr, "model: %zu workers, program:\n%s\nfailed: %s\n\n", m.workers,
                   os.str().c_str(), r.description.c_str());
    }
    throw;
  }
}

}  // namespace crew::test::model
