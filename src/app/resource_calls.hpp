// src/app/resource_calls.hpp (private): calls of Resource::init, ping and close,
// each on a thread of its own under a deadline, and the keeper that pings
// the live resources while the application runs.
//
// Who touches what:
//   a call thread   runs the method; writes AppCall::error, then sets
//                   AppCall::done and notifies the core
//   the waiter      (the controller for init and close, the keeper for
//                   pings) owns AppCall::thread and AppCall::stop: it joins a
//                   call that returned, and stops and detaches one that
//                   overran. A detached call owns references to the resource
//                   and the core, so it touches nothing that can be freed.
//   the keeper      its own thread; reads the core's resources (read-only
//                   once run() started) and keeper_stop; records failures
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <memory>
#include <stop_token>
#include <string_view>
#include <thread>
#include <vector>

#include "app_core.hpp"

namespace crew::detail {

// One init, ping or close running on its own thread.
struct AppCall {
  std::stop_source stop;
  std::atomic<bool> done{false};
  std::exception_ptr error;  // written before `done`
  std::thread thread;        // owned by the waiter
  Clock::time_point started = Clock::now();
};

using ResourceMethod = void (Resource::*)(const ResourceCall&);

// Starts `method` of a resource on a new thread named "<app>-<role>". A call
// that cannot start is returned done, with the error.
std::shared_ptr<AppCall> start_call(const std::shared_ptr<AppCore>& core, const AppResource& entry,
                                    ResourceMethod method, std::string_view role,
                                    Clock::time_point deadline);

// A finished call is joined; one that overran is told to stop and left.
void finish_call(AppCall& call);

// Waits on core.changed (under core.mu) until finished() holds or the
// deadline passes. The first time interrupt() holds before that,
// stop_calls() runs outside the lock (a resource's stop callbacks run
// synchronously in request_stop()) and the wait goes on. Both predicates
// run under core.mu, every time the waiter wakes (so they may record what
// they see). Returns whether stop_calls() ran.
template <class Finished, class Interrupt, class StopCalls>
bool wait_for_calls(AppCore& core, Clock::time_point deadline, Finished finished,
                    Interrupt interrupt, StopCalls stop_calls) {
  bool stop_sent = false;
  for (;;) {
    bool send_stop = false;
    {
      MutexLock lock(core.mu);
      for (;;) {
        const bool finished_now = finished();
        const bool interrupted = interrupt();
        if (finished_now) break;
        if (interrupted && !stop_sent) {
          send_stop = true;
          break;
        }
        if (!wait_or_timeout(core.changed, lock.native(), deadline)) break;
      }
    }
    if (!send_stop) return stop_sent;
    stop_sent = true;
    stop_calls();
  }
}

// The keeper's body: pings the resources at indices `live` every
// ping_period until the controller sets keeper_stop or one fails (then it
// records the failure, which halts). Runs on the keeper thread.
void keep(const std::shared_ptr<AppCore>& core, const std::vector<std::size_t>& live);

}  // namespace crew::detail
