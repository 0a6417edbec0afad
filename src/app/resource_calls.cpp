// Resource calls on threads of their own, and the keeper's ping rounds
// (src/app/resource_calls.hpp).
#include "resource_calls.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "thread_name.hpp"

namespace crew::detail {

std::shared_ptr<AppCall> start_call(const std::shared_ptr<AppCore>& core, const AppResource& entry,
                                    ResourceMethod method, std::string_view role,
                                    Clock::time_point deadline) {
  auto call = std::make_shared<AppCall>();
  try {
    call->thread = std::thread(
        [core, call, resource = entry.resource, method, deadline, role = std::string(role)] {
          name_thread(core->opts.name, role);
          try {
            ((*resource).*method)(ResourceCall{call->stop.get_token(), deadline});
          } catch (...) {
            call->error = std::current_exception();
          }
          call->done.store(true, std::memory_order_release);
          core->notify();
        });
  } catch (...) {
    call->error = std::current_exception();
    call->done.store(true, std::memory_order_release);
  }
  return call;
}

void finish_call(AppCall& call) {
  if (!call.thread.joinable()) return;
  if (call.done.load(std::memory_order_acquire)) {
    call.thread.join();
  } else {
    call.stop.request_stop();
    call.thread.detach();
  }
}

void keep(const std::shared_ptr<AppCore>& core, const std::vector<std::size_t>& live) {
  AppCore& c = *core;
  auto next = after(Clock::now(), c.opts.ping_period);
  for (;;) {
    {
      MutexLock lock(c.mu);
      while (!c.keeper_stop) {
        if (!wait_or_timeout(c.changed, lock.native(), next)) break;
      }
      if (c.keeper_stop) return;
    }
    const auto round_start = Clock::now();
    const auto deadline = after(round_start, c.opts.ping_timeout);
    std::vector<std::shared_ptr<AppCall>> calls;
    calls.reserve(live.size());
    for (std::size_t i : live) {
      calls.push_back(start_call(core, c.resources[i], &Resource::ping, "ping", deadline));
    }
    // Wait for the round. When told to stop meanwhile, stop the pings'
    // tokens and give them the rest of their deadline, so that close does
    // not overlap a ping that is about to return.
    bool stopping = false;
    (void)wait_for_calls(
        c, deadline,
        [&calls] {
          return std::all_of(calls.begin(), calls.end(), [](const auto& call) {
            return call->done.load(std::memory_order_acquire);
          });
        },
        [&c, &stopping] {
          c.mu.assert_held();
          stopping = c.keeper_stop;
          return stopping;
        },
        [&calls] {
          for (auto& call : calls) call->stop.request_stop();
        });
    bool failed = false;
    for (std::size_t k = 0; k < calls.size(); ++k) {
      AppCall& call = *calls[k];
      const AppResource& entry = c.resources[live[k]];
      const std::string& name = entry.name;
      const bool done = call.done.load(std::memory_order_acquire);
      std::optional<Failure> failure;
      if (done && call.error) {
        if (stopping) {
          c.log(LogLevel::warning,
                "ping of " + name + " failed during shutdown: " + describe(call.error));
        } else {
          failure = Failure{FailureKind::ping_failed, name, describe(call.error), call.error};
        }
      } else if (!done) {
        const std::string what = "ping did not return within ping_timeout (" +
                                 std::to_string(ms_of(c.opts.ping_timeout)) + " ms)";
        if (stopping) {
          c.log(LogLevel::warning, "ping of " + name + " left behind during shutdown: " + what);
        } else {
          failure = Failure{FailureKind::ping_timed_out, name, what, nullptr};
        }
      }
      failed = failed || (done && call.error) || !done;
      if (failure) {
        // The resource's policy: halt (graceful) or the hard path at once.
        const bool at_once = entry.on_ping_failure == PingFailure::shutdown_now;
        if (at_once) {
          c.log(LogLevel::warning,
                "ping of " + name + " failed and its on_ping_failure is shutdown_now");
        }
        c.record(std::move(*failure), at_once);
      }
      finish_call(call);
    }
    if (failed || stopping) return;
    next = after(round_start, c.opts.ping_period);
  }
}

}  // namespace crew::detail
