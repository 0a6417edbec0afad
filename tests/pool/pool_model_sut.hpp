// tests/pool/pool_model_sut.hpp: the model's static state (Model, what
// RapidCheck's generator sees) and the system under test with the model's
// records (Sut): the pool, its handles and groups, each blocking call on a
// thread of its own, and the checks after every command (pool_model.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pool_model_tasks.hpp"

namespace crew::test::model {

// ---------------------------------------------------------------------------
// The model's static state (what RapidCheck's generator sees) and the system
// under test with the model's records.

struct Model {
  std::size_t workers = 1;  // min_workers; max_workers starts there
  // The pool runs the overload controller (PoolOptions::overload) with a
  // target and an interval short enough for a program's tasks to reach
  // them: a submission may then be refused `overloaded`, and an accepted
  // task shed unrun.
  bool overload = false;
  std::size_t overload_limit = 0;  // OverloadOptions::max_limit (0: its default)
  double start_rate = 0;           // PoolOptions::max_start_rate (0: none)
  std::size_t start_burst = 0;     // PoolOptions::start_burst
  bool time_tasks = false;         // PoolOptions::time_tasks
  bool paused = false;
  bool stopped = false;
  int handles = 0;
  int groups = 0;
};

class Sut {
 public:
  explicit Sut(const Model& m);
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

  // Every task of the program as the model saw it (one line each), and
  // the pool's counts: appended to a failure's message.
  [[nodiscard]] std::string tasks_seen() const;

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
  bool overload = false;  // Model::overload
  bool timed = false;     // Model::time_tasks
  std::string program;    // the commands, shown

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
      case TaskStatus::shed:
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

// A handle's durations (Task::queue_wait, run_time): 0 in a pool that does
// not time its tasks and until the outcome; a task that never ran has no
// run time.
inline std::string times_fit(const Rec& r, const Task<void>& h, bool timed) {
  const auto wait = h.queue_wait();
  const auto ran = h.run_time();
  const bool zero_run = !timed || !h.ready() || r.started.load() == 0;
  const bool zero_wait = !timed || !h.ready();
  if ((zero_run && ran.count() != 0) || (zero_wait && wait.count() != 0) || wait.count() < 0 ||
      ran.count() < 0) {
    return r.label() + ": queue_wait " + std::to_string(wait.count()) + " ns, run_time " +
           std::to_string(ran.count()) + " ns (" + (timed ? "timed" : "untimed") + " pool, " +
           status_name(h.status()) + ", started " + std::to_string(r.started.load()) + "x)\n";
  }
  return "";
}

inline Sut::Sut(const Model& m) : overload(m.overload), timed(m.time_tasks) {
  PoolOptions o = fixed_workers("model", m.workers);
  o.abandon_grace = kAbandonGrace;
  o.priority_levels = kPriorityLevels;
  o.max_start_rate = m.start_rate;
  o.start_burst = m.start_burst;
  o.time_tasks = m.time_tasks;
  if (overload) {
    o.overload.enabled = true;
    o.overload.target = 1ms;
    o.overload.interval = 10ms;
    o.overload.max_limit = m.overload_limit;
  }
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
  ctx->paused.store(0);
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

inline const char* owner_name(Owner o) {
  switch (o) {
    case Owner::handle:
      return "handle";
    case Owner::post:
      return "post";
    case Owner::group:
      return "group";
    case Owner::batch:
      return "batch";
    case Owner::child_handle:
      return "child_handle";
  }
  return "?";
}

inline std::string Sut::tasks_seen() const {
  std::ostringstream os;
  os << "tasks:\n";
  for (const auto& r : ctx->recs()) {
    const int a = r->admission.load();
    os << "  " << r->label() << ": " << owner_name(r->owner);
    if (r->owner == Owner::group) os << " " << r->group;
    os << ", admission "
       << (a < 0 ? std::string("none") : std::string(to_string(static_cast<Admission>(a))))
       << ", started " << r->started.load() << ", running " << r->running.load() << ", finished "
       << r->finished.load() << ", threw " << r->threw.load() << "\n";
  }
  if (pool) {
    const PoolStats st = pool->stats();
    os << "stats: submitted " << st.submitted << ", succeeded " << st.outcomes.succeeded
       << ", failed " << st.outcomes.failed << ", cancelled " << st.outcomes.cancelled
       << ", timed_out " << st.outcomes.timed_out << ", rejected " << st.outcomes.rejected
       << ", shed " << st.outcomes.shed << "; refused (limit, deadline) "
       << st.overload.refused_limit << ", " << st.overload.refused_deadline
       << "; shed (codel, priority) " << st.overload.shed_codel << ", " << st.overload.shed_priority
       << "\n";
  }
  return os.str();
}

inline void Sut::expect_no_violation() {
  const std::vector<std::string> v = ctx->violations();
  if (v.empty()) return;
  std::string all;
  for (const std::string& s : v) all += s + (s.ends_with('\n') ? "" : "\n");
  RC_FAIL(all + tasks_seen());
}

inline void Sut::check(const Model& m) {
  expect_no_violation();
  const PoolStats st = pool->stats();
  RC_ASSERT(st.outcomes.total() <= st.submitted);
  if (!m.overload) RC_ASSERT(st.outcomes.shed == 0u);
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
    note(times_fit(*handle_recs[i], h, timed));
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

// The pool is quiescent: every submission has an outcome, the pool
// counted as many as the model made, and the overload controller holds no
// admission ticket.
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
  if (st.submitted != st.outcomes.total()) {
    RC_FAIL("quiescent, but stats() counts " + std::to_string(st.submitted) + " submissions and " +
            std::to_string(st.outcomes.total()) + " outcomes\n" + sut.tasks_seen());
  }
  if (st.submitted < lo || st.submitted > hi) {
    RC_FAIL("stats().submitted is " + std::to_string(st.submitted) + "; the program made " +
            std::to_string(lo) + ".." + std::to_string(hi) + " submissions\n" + sut.tasks_seen());
  }
  // A ticket goes back just after its task's outcome is published.
  if (!eventually([&sut] { return sut.pool->stats().overload.admitted == 0; },
                  std::chrono::duration_cast<std::chrono::milliseconds>(kBound))) {
    RC_FAIL("quiescent, but the overload controller counts " +
            std::to_string(sut.pool->stats().overload.admitted) + " tasks admitted");
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
     << st.outcomes.rejected << " shed " << st.outcomes.shed << "; the model: " << n
     << " submitted, " << never << " never started, " << ok << " returned (" << short_ok
     << " short), " << threw << " threw (" << short_threw << " short)";
  if (st.pending != 0 || st.submitted != n || st.outcomes.total() != n ||
      st.outcomes.failed < short_threw || st.outcomes.failed > threw ||
      st.outcomes.succeeded < short_ok || st.outcomes.succeeded > ok ||
      st.outcomes.cancelled + st.outcomes.rejected + st.outcomes.shed < never) {
    RC_FAIL(os.str());
  }
  expect_no_violation();
}

inline std::string show_ref(const TaskRef& t) {
  return "#" + std::to_string(t.id) + (t.name.empty() ? "" : " '" + t.name + "'");
}

inline void Sut::shutdown(ShutdownMode mode, std::chrono::milliseconds timeout) {
  ctx->paused.store(0);  // a shutdown runs or ends what a pause held
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
    // refused) before the shutdown; the overload controller may have shed
    // any task.
    const bool unsure =
        overload || r->spec.queue_timeout_ms != 0 || r->owner == Owner::child_handle ||
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
        << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms\n"
        << tasks_seen();
    RC_FAIL(all.str());
  }
  // Quiescent unless a callable still runs on a thread written off by this
  // shutdown or an earlier one (nested in a wait of the task it was written
  // off with, a task has no outcome until it returns).
  const bool still_running = std::any_of(recs.begin(), recs.end(), [](const auto& r) {
    return r->running.load() && r->owner != Owner::batch;
  });
  if (rep.abandoned_unnamed == 0 && rep.abandoned.empty() && !still_running) {
    check_quiescent(*this);
  }
  expect_no_violation();
}

}  // namespace crew::test::model
