// bench/isolate.cpp: see isolate.hpp.
#include "isolate.hpp"

#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace bench {
namespace {

// What crosses the pipe: the numeric part of a Sample.
struct Figures {
  double ns_per_task;
  double allocs_per_task;
  double stack_kib;
};

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace

Sample run_isolated(int timeout_seconds, const std::function<Sample()>& body) {
  int fds[2];
  if (pipe(fds) != 0) fail("pipe() failed");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) fail("fork() failed");
  if (pid == 0) {
    g_in_isolated_child = true;
    close(fds[0]);
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    const Sample s = body();
    const Figures f{s.ns_per_task, s.allocs_per_task, s.stack_kib};
    const bool sent = write(fds[1], &f, sizeof f) == static_cast<ssize_t>(sizeof f);
    std::_Exit(sent ? 0 : 1);
  }
  close(fds[1]);

  // Waits on the pipe, not in a polling loop: the parent shares the
  // machine with the measured workers, and a poller waking every few
  // milliseconds would preempt one of them each time (on 2 CPUs that cost
  // the fork-join rows about a hundred context switches per run). The pipe
  // becomes readable when the child sends its figures, and hangs up when it
  // exits or dies; a child still running at the deadline is killed.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  int status = 0;
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      kill(pid, SIGKILL);
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 60'000)));
    if (ready > 0) break;
    if (ready < 0 && errno != EINTR) fail("poll() failed");
  }
  // The child exits right after its figures (or has died, or was killed).
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) fail("waitpid() failed");
  }
  Figures f{};
  const bool received = read(fds[0], &f, sizeof f) == static_cast<ssize_t>(sizeof f);
  close(fds[0]);

  Sample s;
  if (timed_out) {
    s.failure = "timeout after " + std::to_string(timeout_seconds) + " s";
  } else if (WIFSIGNALED(status)) {
    s.failure = signal_name(WTERMSIG(status));
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == kFailedCheckExit) {
    fail("a check failed in an isolated run (see above)");
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !received) {
    s.failure = "child exited with status " + std::to_string(WEXITSTATUS(status));
  } else {
    s.ns_per_task = f.ns_per_task;
    s.allocs_per_task = f.allocs_per_task;
    s.stack_kib = f.stack_kib;
  }
  return s;
}

}  // namespace bench
