// tests/pool/pool_model.hpp: a model of crew's contracts and the commands of the
// random programs that tests/pool/model_test.cpp checks against it (RapidCheck's
// stateful testing).
//
// A program builds a pool (1-3 workers, 3 priority levels; in half of
// the programs the overload controller on with a 1 ms target, in a
// quarter a start rate of 1,000/s, in half the tasks timed) and runs a
// sequence of commands on it: post (alone or a burst of them),
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
// - a handle's durations are 0 until its outcome, and always in a pool that
//   does not time its tasks; a task that never ran has no run time;
// - a task submitted after pause() returned does not start before resume()
//   or a shutdown is called (but a subtask may, in its parent's get());
//   one queued before the pause may (a worker may have taken it just before);
// - a submission is refused `closed` exactly when the pool is stopped, and
//   `overloaded` only with the controller on; a task is shed only unrun,
//   and only with the controller on;
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
//
// The parts: the tasks and their records (pool_model_tasks.hpp), Model and
// Sut (pool_model_sut.hpp), and here the commands and the program.
#pragma once

#include <rapidcheck.h>
#include <rapidcheck/state.h>

#include <memory>
#include <vector>

#include "pool_model_sut.hpp"

namespace crew::test::model {

// ---------------------------------------------------------------------------
// Commands.

using Command = rc::state::Command<Model, Sut>;

// Posts a task of `spec`: accepted, or refused `closed` exactly when the
// pool is stopped, or `overloaded` by the controller.
inline void post_one(const Model& m, Sut& sut, const Spec& spec) {
  const auto r = sut.ctx->add(Owner::post, spec, -1);
  Pool& p = *sut.pool;
  const Admission a = with_body(
      sut.ctx, nullptr, r, [&](auto&& body) { return p.post(std::move(body), options_of(*r)); });
  r->admission.store(static_cast<int>(a));
  RC_ASSERT(a == (m.stopped ? Admission::closed : Admission::accepted) ||
            (a == Admission::overloaded && m.overload && !m.stopped));
}

struct Post final : Command {
  Spec spec = *gen_spec();
  void run(const Model& m, Sut& sut) const override {
    post_one(m, sut, spec);
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "post " << spec; }
};

// Several posts back to back, with no check between them: what reaches an
// admission limit, a standing queue and a priority's displacement.
struct Burst final : Command {
  std::vector<Spec> specs = *rc::gen::container<std::vector<Spec>>(
      static_cast<std::size_t>(*rc::gen::inRange(2, 7)), gen_spec());
  void run(const Model& m, Sut& sut) const override {
    for (const Spec& spec : specs) post_one(m, sut, spec);
    sut.check(m);
  }
  void show(std::ostream& os) const override {
    os << "burst of posts";
    for (const Spec& s : specs) os << " " << s;
  }
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
    Admission a = Admission::accepted;
    if (h.status() == TaskStatus::rejected && h.reason() == Errc::rejected) {
      try {
        h.get();  // refused: ready, so get() throws at once, and says why
      } catch (const Error& e) {
        a = e.admission();
      }
      RC_ASSERT(a != Admission::accepted);
    }
    r->admission.store(static_cast<int>(a));
    RC_ASSERT((a == Admission::closed) == m.stopped);
    RC_ASSERT(a == Admission::accepted || a == Admission::closed ||
              (a == Admission::overloaded && m.overload));
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
    const bool closed = m.stopped || sut.group_cancelled[k];
    RC_ASSERT(a == (closed ? Admission::closed : Admission::accepted) ||
              (a == Admission::overloaded && m.overload && !closed));
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
    bool unsubmitted_seen = false;  // past the deadline: every later task too
    for (std::size_t i = 0; i < recs.size(); ++i) {
      Rec& r = *recs[i];
      const Outcome<void>& o2 = result->outcomes[i];
      r.batch_id = o2.id;
      sut.note(fits(r, o2.status, o2.reason));
      // A stopped pool refuses each task the batch submits; with a total
      // timeout, the tasks after the deadline are never submitted (id 0,
      // cancelled), and the deadline may pass while the first refusals
      // are made (5 ms: a preemption under a sanitizer is as long). Those
      // are the last ones: once one is left out, so is every later one.
      if (m.stopped) {
        const bool never_submitted = timeout_ms != 0 && result->timed_out && o2.id == 0 &&
                                     o2.status == TaskStatus::cancelled;
        RC_ASSERT(never_submitted || (o2.status == TaskStatus::rejected && !unsubmitted_seen));
        unsubmitted_seen = unsubmitted_seen || never_submitted;
      }
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
    sut.ctx->paused.store(++sut.ctx->pauses);
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "pause"; }
};

struct Resume final : Command {
  void checkPreconditions(const Model& m) const override { RC_PRE(m.paused); }
  void apply(Model& m) const override { m.paused = false; }
  void run(const Model& m, Sut& sut) const override {
    sut.ctx->paused.store(0);
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
  // What the overload controller did, shown as RapidCheck's distribution.
  const OverloadStats ov = pool->stats().overload;
  RC_CLASSIFY(ov.refused_limit + ov.refused_deadline != 0, "the controller refused tasks");
  RC_CLASSIFY(ov.shed_codel != 0, "CoDel shed tasks");
  RC_CLASSIFY(ov.shed_priority != 0, "a higher priority displaced tasks");
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
  return rc::state::gen::execOneOfWithArgs<Post, Burst, Submit, Submit, Cancel, Get, Get, NewGroup,
                                           GroupSubmit, GroupSubmit, GroupSubmit, GroupWait,
                                           GroupCancel, Batch, Pause, Resume, Resize, StopWorker,
                                           WaitIdle, Shutdown, Restart, Release>();
}

// The pool a program runs on, shown on one line (showValue below) where
// a failure prints its program.
struct Setup {
  Model m;
};

inline void showValue(const Setup& s, std::ostream& os) {
  const Model& m = s.m;
  os << m.workers << (m.workers == 1 ? " worker" : " workers");
  if (m.overload) {
    os << ", overload controller on (limit at most ";
    if (m.overload_limit == 0) {
      os << "its default)";
    } else {
      os << m.overload_limit << ")";
    }
  }
  if (m.start_rate != 0)
    os << ", start rate " << m.start_rate << "/s (burst " << m.start_burst << ")";
  os << (m.time_tasks ? ", tasks timed" : ", tasks untimed");
}

// A pool of 1-3 workers; the controller on in half of the programs, with
// a small ceiling on the adaptive limit, so that short programs reach it;
// in a quarter of them the workers start at most 1,000 tasks a second, 1-3
// at once; the tasks timed in half.
inline rc::Gen<Setup> gen_setup() {
  return rc::gen::exec([] {
    Setup s;
    Model& m = s.m;
    m.workers = static_cast<std::size_t>(*rc::gen::inRange(1, 4));
    m.overload = *rc::gen::arbitrary<bool>();
    if (m.overload) m.overload_limit = *rc::gen::element<std::size_t>(0, 2, 2, 3);
    if (*rc::gen::element(false, false, false, true)) {
      m.start_rate = 1000;
      m.start_burst = static_cast<std::size_t>(*rc::gen::inRange(1, 4));
    }
    m.time_tasks = *rc::gen::arbitrary<bool>();
    return s;
  });
}

// One random program: a pool (gen_setup), a sequence of commands, and the
// end (Sut::finish).
inline void run_program() {
  Model m = (*gen_setup()).m;
  const auto cmds = *rc::state::gen::commands(m, gen_command());
  try {
    Sut sut(m);
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
      showValue(Setup{m}, os);
      os << ", program:\n";
      rc::show(cmds, os);
      std::fprintf(stderr, "model: %s\nfailed: %s\n\n", os.str().c_str(), r.description.c_str());
    }
    throw;
  }
}

}  // namespace crew::test::model
