// The signal self-pipe: the handler, the process-wide state it reads, and
// the watcher that owns the pipe and its reader thread (src/app/signals.hpp).
#include "signals.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "thread_name.hpp"

namespace crew::detail {
namespace {

// Read by the handler on whatever thread the signal lands on; written by
// the watcher that owns signals (g_signals_owned) in start() and stop().
std::atomic<int> g_signal_fd{-1};
std::atomic<int> g_in_handler{0};
std::atomic<bool> g_signals_owned{false};
static_assert(std::atomic<int>::is_always_lock_free);

// The dispositions the owning watcher replaced (stop() restores them) and
// its pipe's read end: what a child of fork() must undo too. Written by the
// owning watcher in start() and stop(), read by the child handler (the
// child's only thread).
constexpr int kMaxSignals = 64;
struct Inherited {
  int count = 0;
  int signo[kMaxSignals] = {};
  struct sigaction old[kMaxSignals] = {};
  int read_fd = -1;
};
Inherited g_inherited;

// The stop byte: no signal has number 0, so the reader stops on it even
// while another process (a child that has not yet run its handler) still
// holds a copy of the write end, which would keep it from seeing EOF.
constexpr unsigned char kStopByte = 0;

// In a child of fork(): the signals go back to what they were before the
// watcher (a SIGTERM sent to the child ends the child, not the parent's
// application), and the child's copies of the pipe are closed.
void in_child() noexcept {
  const int fd = g_signal_fd.exchange(-1, std::memory_order_seq_cst);
  if (fd < 0) return;
  for (int i = 0; i < g_inherited.count; ++i) {
    (void)sigaction(g_inherited.signo[i], &g_inherited.old[i], nullptr);
  }
  (void)close(fd);
  if (g_inherited.read_fd >= 0) (void)close(g_inherited.read_fd);
}
[[maybe_unused]] const int g_fork_handler = pthread_atfork(nullptr, nullptr, in_child);

void on_signal_handler(int signo) {
  const int saved = errno;
  g_in_handler.fetch_add(1, std::memory_order_seq_cst);
  const int fd = g_signal_fd.load(std::memory_order_seq_cst);
  if (fd >= 0) {
    const auto byte = static_cast<unsigned char>(signo);
    if (write(fd, &byte, 1) < 0) {
      // The pipe is full (tens of thousands of unread signals) or gone: the
      // signals already queued say enough.
    }
  }
  g_in_handler.fetch_sub(1, std::memory_order_seq_cst);
  errno = saved;
}

// Runs on the reader thread until the write end is closed.
void read_loop(int fd, const std::function<void(int)>& on_signal) {
  unsigned char buf[64];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] == kStopByte) return;
      on_signal(buf[i]);
    }
  }
}

}  // namespace

std::string signal_name(int signo) {
  switch (signo) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    default:
      return "signal " + std::to_string(signo);
  }
}

std::string SignalWatcher::start(const std::vector<int>& signals, const std::string& app_name,
                                 std::function<void(int)> on_signal) {
  if (signals.empty()) return {};
  bool expected = false;
  if (!g_signals_owned.compare_exchange_strong(expected, true)) {
    return "another Application is handling signals";
  }
  owned_ = true;
  if (pipe2(fds_, O_CLOEXEC) != 0) return std::string("pipe2: ") + std::strerror(errno);
  // The handler must never block; a full pipe drops the byte.
  (void)fcntl(fds_[1], F_SETFL, fcntl(fds_[1], F_GETFL) | O_NONBLOCK);
  if (signals.size() > static_cast<std::size_t>(kMaxSignals)) return "too many signals";
  g_inherited.count = 0;
  g_inherited.read_fd = fds_[0];
  g_signal_fd.store(fds_[1], std::memory_order_seq_cst);

  sigset_t mask;
  sigemptyset(&mask);
  for (int s : signals) sigaddset(&mask, s);
  try {
    const int rfd = fds_[0];
    thread_ = std::thread([on_signal = std::move(on_signal), app_name, rfd, mask] {
      // Only this thread blocks the signals: it must not be interrupted in
      // read(), and it is the watcher's own.
      (void)pthread_sigmask(SIG_BLOCK, &mask, nullptr);
      name_thread(app_name, "signals");
      read_loop(rfd, on_signal);
    });
  } catch (const std::exception& e) {
    return std::string("cannot start the signal thread: ") + e.what();
  }

  struct sigaction sa {};
  sa.sa_handler = &on_signal_handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : signals) {
    struct sigaction old {};
    if (sigaction(s, &sa, &old) != 0) {
      return "sigaction(" + signal_name(s) + "): " + std::strerror(errno);
    }
    g_inherited.signo[g_inherited.count] = s;
    g_inherited.old[g_inherited.count] = old;
    ++g_inherited.count;
  }
  return {};
}

void SignalWatcher::stop() noexcept {
  if (owned_) {  // what this watcher installed, in the reverse order
    for (int i = g_inherited.count - 1; i >= 0; --i) {
      (void)sigaction(g_inherited.signo[i], &g_inherited.old[i], nullptr);
    }
    g_inherited.count = 0;
  }
  if (fds_[1] >= 0) {
    g_signal_fd.store(-1, std::memory_order_seq_cst);
    // A handler that loaded the fd before the store may still write to it.
    while (g_in_handler.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
    g_inherited.read_fd = -1;
    // The reader stops at the stop byte (or at end of file, if the pipe was
    // full); signals written before it are still delivered.
    const unsigned char stop = kStopByte;
    while (write(fds_[1], &stop, 1) < 0 && errno == EINTR) {
    }
    (void)close(fds_[1]);
    fds_[1] = -1;
  }
  if (thread_.joinable()) thread_.join();
  if (fds_[0] >= 0) {
    (void)close(fds_[0]);
    fds_[0] = -1;
  }
  if (owned_) {
    g_signals_owned.store(false);
    owned_ = false;
  }
}

}  // namespace crew::detail
