// The Pool facade: the public calls, each a check of its caller (a wait
// from the pool's own task, a fork child) and a call into the core.
#include "crew/pool.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "crew/detail/overload_control.hpp"
#include "crew/detail/pool_control.hpp"

namespace crew {

// ---- Pool ----

namespace {

// wait_idle() and shutdown() wait for the pool's tasks: from one of them
// they would wait for itself, and in a child of fork() on a pool created
// before the fork, for workers that are not there.
void refuse_self_wait(const detail::PoolCore& core, const char* call) {
  if (core.inherited_by_fork()) {
    throw Error(Errc::would_deadlock, std::string("crew::Pool::") + call + " on pool '" +
                                          core.options().name +
                                          "' in a child of fork(): its workers are not there");
  }
  if (!core.in_own_task()) return;
  throw Error(Errc::would_deadlock, std::string("crew::Pool::") + call +
                                        " called from a task of pool '" + core.options().name +
                                        "': it would wait for itself");
}

}  // namespace

Pool::Pool(PoolOptions options) : core_(std::make_shared<detail::PoolCore>(std::move(options))) {
  detail::PoolControl(*core_).start();
}

Pool::~Pool() {
  if (core_->inherited_by_fork()) {
    // A child of fork() destroys its copy of a pool (it returned from main,
    // or called exit()): the threads a shutdown would wait for, and whose
    // thread objects the core would destroy, are the parent's. Nothing of
    // the copy runs or is freed; the child's exit or exec takes it.
    (void)new std::shared_ptr<detail::PoolCore>(std::move(core_));
    return;
  }
  if (detail::t_current.core == core_.get()) {
    std::fprintf(stderr, "crew: pool '%s' destroyed from one of its own workers\n",
                 core_->options().name.c_str());
    std::abort();  // it would wait for itself forever
  }
  // A shutdown that throws (out of memory for its report) is given up
  // cleanly and can run again; after three such failures the process ends.
  for (int attempt = 0;; ++attempt) {
    try {
      (void)detail::PoolControl(*core_).shutdown(core_->options().shutdown_mode,
                                                 core_->options().shutdown_timeout);
      break;
    } catch (const std::bad_alloc&) {
      if (attempt == 2) std::terminate();
    }
  }
  detail::PoolControl(*core_).stop_supervisor();
  core_->mark_released();
}

ShutdownReport Pool::shutdown(ShutdownMode mode, std::chrono::nanoseconds timeout) {
  if (!detail::valid_shutdown_mode(mode)) {
    throw Error(Errc::invalid_options, "crew::Pool::shutdown: mode " +
                                           std::to_string(static_cast<int>(mode)) +
                                           " is not drain, soft or hard");
  }
  refuse_self_wait(*core_, "shutdown()");
  return detail::PoolControl(*core_).shutdown(mode, timeout);
}
ShutdownReport Pool::shutdown() {
  refuse_self_wait(*core_, "shutdown()");
  return detail::PoolControl(*core_).shutdown(core_->options().shutdown_mode,
                                              core_->options().shutdown_timeout);
}
bool Pool::restart() { return detail::PoolControl(*core_).restart(); }
void Pool::pause() { detail::PoolControl(*core_).pause(); }
void Pool::resume() { detail::PoolControl(*core_).resume(); }
void Pool::resize(std::size_t max_workers) { detail::PoolControl(*core_).resize(max_workers); }
bool Pool::stop_worker(std::uint64_t worker_id, WorkerStop how) {
  return detail::PoolControl(*core_).stop_worker(worker_id, how);
}
bool Pool::run_pending_task() { return core_->inline_runner().run_pending(); }
PoolState Pool::state() const noexcept { return core_->state(); }
bool Pool::inherited_by_fork() const noexcept { return core_->inherited_by_fork(); }
PoolStats Pool::stats() const { return detail::PoolSnapshot(*core_).stats(); }
PoolStatsHandle Pool::stats_handle() const { return {core_, core_->options().name}; }
OverloadHint Pool::overload_hint() const noexcept {
  const detail::OverloadControl* ctl = core_->overload();
  return ctl != nullptr ? ctl->hint() : OverloadHint{};
}

OverloadHint Pool::refuse_if_overloaded() noexcept {
  detail::OverloadControl* ctl = core_->overload();
  if (ctl == nullptr) return {};
  const OverloadHint h = ctl->hint();
  if (h.reason != OverloadReason::none) ctl->note_refused_early();
  return h;
}

std::optional<PoolStats> PoolStatsHandle::read() const {
  const std::shared_ptr<const detail::PoolCore> core = core_.lock();
  if (!core || core->released()) return std::nullopt;
  return detail::PoolSnapshot(*core).stats();
}
std::optional<std::vector<WorkerInfo>> PoolStatsHandle::workers() const {
  const std::shared_ptr<const detail::PoolCore> core = core_.lock();
  if (!core || core->released()) return std::nullopt;
  return detail::PoolSnapshot(*core).workers();
}
std::vector<WorkerInfo> Pool::workers() const { return detail::PoolSnapshot(*core_).workers(); }
const PoolOptions& Pool::options() const noexcept { return core_->options(); }
std::string_view Pool::name() const noexcept { return core_->options().name; }
bool Pool::wait_idle(std::chrono::nanoseconds timeout) {
  refuse_self_wait(*core_, "wait_idle()");
  return detail::PoolControl(*core_).wait_idle(
      detail::saturating_deadline(std::chrono::steady_clock::now(), timeout));
}

}  // namespace crew
