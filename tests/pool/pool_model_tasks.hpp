// tests/pool/pool_model_tasks.hpp: the tasks of the model's random programs
// (pool_model.hpp): what each task does (Spec, generated), the model's record
// of it (Rec), the bodies that run it and report to its record, and the
// bounded call every blocking command goes through.
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
// The pool's priority levels (PoolOptions::priority_levels); a task's
// TaskOptions::priority is one of them.
inline constexpr std::size_t kPriorityLevels = 3;
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
  int priority = 0;  // 0 .. kPriorityLevels - 1
};

inline std::ostream& operator<<(std::ostream& os, const Spec& s) {
  os << "{" << to_cstr(s.act);
  if (s.act == Act::sleep || s.act == Act::spin) os << " " << s.amount;
  os << (s.is_long ? " long" : " short") << (s.named ? " named" : "");
  if (s.timeout_ms != 0) os << " timeout=" << s.timeout_ms << "ms";
  if (s.queue_timeout_ms != 0) os << " queue_timeout=" << s.queue_timeout_ms << "ms";
  if (s.priority != 0) os << " priority=" << s.priority;
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
    s.priority = *rc::gen::element(0, 0, 1, 2);
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
  // Submitted after pause() returned and before resume() or a shutdown was
  // called: that pause (Ctx::paused when it was recorded), during which it
  // must not start; 0 when submitted otherwise. (A task queued before a
  // pause may still start during it: a worker may have taken it just before.)
  int paused_in = 0;

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
  // From pause() returning until the program calls resume() or a shutdown
  // (set by the driver just before those calls): that pause's number (1,
  // 2, ...); 0 while the pool is not paused.
  std::atomic<int> paused{0};
  int pauses = 0;  // the driver's count

  // A task about to be submitted (before its submission, so that it is
  // recorded before it can run).
  std::shared_ptr<Rec> add(Owner o, const Spec& s, int group) {
    const std::lock_guard lock(mu_);
    recs_.push_back(std::make_shared<Rec>(static_cast<int>(recs_.size()), o, s, group));
    recs_.back()->paused_in = paused.load();
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
  o.priority = static_cast<std::uint8_t>(r.spec.priority);
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
  // A wait may run the subtask it waits for, paused or not.
  if (r.paused_in != 0 && r.owner != Owner::child_handle && ctx->paused.load() == r.paused_in) {
    ctx->violation(r.label() + ": started during the pause it was submitted in");
  }
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

}  // namespace crew::test::model
