// src/app/signals.hpp (private): the signal self-pipe of the Application.
//
// A SignalWatcher installs a handler for a set of signals; the handler only
// writes the signal number to a pipe (async-signal-safe: lock-free atomics,
// write(2), errno saved). A reader thread of the watcher's own reads the
// pipe and passes each number, in order, to a callback. A self-pipe rather
// than signalfd, because signalfd needs the signals blocked in every thread
// of the process; here only the reader blocks them (it must not be
// interrupted in read()), and no other thread's mask changes.
//
// Who touches what:
//   any thread   the handler: loads the pipe's write end, writes one byte
//   the caller   start() and stop(): dispositions, the pipe, the reader
//   the reader   the pipe's read end; runs the callback
// The process has one set of dispositions, so one watcher at a time may be
// started; a second start() fails with a message until the first stops.
#pragma once

#include <signal.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace crew::detail {

// "SIGTERM", "SIGINT", ...; "signal N" for those without a name here.
[[nodiscard]] std::string signal_name(int signo);

// Not thread-safe: start() and stop() are called from one thread (the
// application's controller).
class SignalWatcher {
 public:
  SignalWatcher() = default;
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;
  ~SignalWatcher() { stop(); }

  // Starts the reader thread (named "<app_name>-signals"), then installs the
  // handler for each of `signals`. `on_signal` runs on the reader thread,
  // once per signal caught, in the order they were caught, until stop()
  // returns. Returns an empty string, or why signals cannot be handled (call
  // stop() then to undo what was done). An empty `signals` does nothing.
  [[nodiscard]] std::string start(const std::vector<int>& signals, const std::string& app_name,
                                  std::function<void(int)> on_signal);

  // Restores the previous dispositions, then stops the reader: waits for it
  // to read what is left in the pipe and to return from the callback.
  // Idempotent.
  void stop() noexcept;

 private:
  int fds_[2] = {-1, -1};
  std::thread thread_;
  bool owned_ = false;
};

}  // namespace crew::detail
