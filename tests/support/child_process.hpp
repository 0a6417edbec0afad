// tests/support/child_process.hpp: a child process whose stdout (and, with
// Output::merged, stderr) a test reads line by line (fork + exec, a pipe,
// poll), for application_test: it runs
// tests/app/app_child and the graceful_consumer example, sends them real
// signals and checks what they print. Every wait is bounded: a child that
// overruns is killed and the test fails; the destructor kills and reaps a
// child still running.
//
// app_child prints "<ms since start> <event>"; events() strips the time, and
// find / count / expect_order look events up by prefix.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace crew::test {

class Child {
  using Clock = std::chrono::steady_clock;

 public:
  // What the pipe carries: stdout, or stdout and stderr (the child's log).
  enum class Output { stdout_only, merged };

  explicit Child(std::vector<std::string> args, Output output = Output::stdout_only) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    start_ = Clock::now();
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork");
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      dup2(fds[1], 1);
      if (output == Output::merged) dup2(fds[1], 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (!reaped_) {
      kill(pid_, SIGKILL);
      int st = 0;
      waitpid(pid_, &st, 0);
    }
    if (fd_ >= 0) close(fd_);
  }

  // Reads until a line containing `text` arrives; false (and the child is
  // killed) if it does not within `limit`.
  bool wait_for_line(const std::string& text, std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit * kSlowdown;
    for (;;) {
      for (; scanned_ < lines_.size(); ++scanned_) {
        if (lines_[scanned_].find(text) != std::string::npos) {
          ++scanned_;
          return true;
        }
      }
      if (!read_some(deadline)) {
        ADD_FAILURE() << "no line containing '" << text << "' within " << limit.count()
                      << " ms; output so far:\n"
                      << output();
        kill(pid_, SIGKILL);
        return false;
      }
    }
  }

  void signal(int signo) {
    signalled_at_ = Clock::now();
    ASSERT_EQ(kill(pid_, signo), 0);
  }

  // Waits for the child to exit (reading its output meanwhile); kills it and
  // fails after `limit`. Returns the wait status.
  int wait_exit(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit * kSlowdown;
    int status = 0;
    for (;;) {
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (Clock::now() >= deadline) {
        ADD_FAILURE() << "child did not exit within " << limit.count() << " ms; output:\n"
                      << output();
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      (void)read_some(Clock::now() + std::chrono::milliseconds(1));
    }
    exited_at_ = Clock::now();
    reaped_ = true;
    while (read_some(Clock::now() + std::chrono::milliseconds(200))) {
    }
    return status;
  }

  [[nodiscard]] std::chrono::milliseconds since_signal() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(exited_at_ - signalled_at_);
  }
  [[nodiscard]] std::chrono::milliseconds lifetime() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(exited_at_ - start_);
  }
  [[nodiscard]] const std::vector<std::string>& lines() const { return lines_; }
  [[nodiscard]] std::string output() const {
    std::string all;
    for (const auto& l : lines_) all += l + "\n";
    return all;
  }

 private:
  // False on end of file or when nothing arrived before the deadline.
  bool read_some(Clock::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::max<long long>(0, left.count()))) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0) return false;
    partial_.append(buf, static_cast<std::size_t>(n));
    for (std::size_t nl; (nl = partial_.find('\n')) != std::string::npos;) {
      lines_.push_back(partial_.substr(0, nl));
      partial_.erase(0, nl + 1);
    }
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string partial_;
  std::vector<std::string> lines_;
  std::size_t scanned_ = 0;
  Clock::time_point start_, signalled_at_, exited_at_;
};

// The events of app_child without their timestamps.
inline std::vector<std::string> events(const Child& child) {
  std::vector<std::string> out;
  for (const auto& l : child.lines()) {
    const auto sp = l.find(' ');
    out.push_back(sp == std::string::npos ? l : l.substr(sp + 1));
  }
  return out;
}

// Index of the first event starting with `prefix`, or -1.
inline long find(const std::vector<std::string>& ev, const std::string& prefix) {
  for (std::size_t i = 0; i < ev.size(); ++i) {
    if (ev[i].rfind(prefix, 0) == 0) return static_cast<long>(i);
  }
  return -1;
}

inline long count(const std::vector<std::string>& ev, const std::string& prefix) {
  long n = 0;
  for (const auto& e : ev) n += e.rfind(prefix, 0) == 0 ? 1 : 0;
  return n;
}

// Each event appears, in this order.
inline void expect_order(const std::vector<std::string>& ev, const std::vector<std::string>& order,
                         const std::string& output) {
  long last = -1;
  std::string last_name = "(start)";
  for (const auto& name : order) {
    const long i = find(ev, name);
    EXPECT_GE(i, 0) << "missing '" << name << "' in:\n" << output;
    EXPECT_GT(i, last) << "'" << name << "' came before '" << last_name << "' in:\n" << output;
    last = std::max(last, i);
    last_name = name;
  }
}

inline int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

}  // namespace crew::test
