// service/tests/crewd_harness.hpp: runs crewd as a child process and talks
// HTTP/1.1 to it over raw sockets, for the service's integration tests.
//
// Raw sockets rather than an HTTP client library: the SIGTERM test must tell
// a refused connection from a reset one, and a complete response from a
// truncated one, and must know when each request left the client.
//
// Every wait here is bounded (timeouts scale with kSlowdown under sanitizers).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test_util.hpp"
#include "text_search.hpp"

#ifndef CREWD_BINARY
#error "CREWD_BINARY must name the crewd executable, relative to the test executable"
#endif

namespace crewd::test {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Sanitizers slow everything down; bounds scale with it (crew's tests' rule).
using crew::test::kSlowdown;

inline std::int64_t monotonic_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// The result of one request on its own connection (Connection: close).
struct Exchange {
  enum class Outcome {
    response,   // a complete response (status line, headers, Content-Length bytes)
    refused,    // connect() failed: ECONNREFUSED
    reset,      // reset or closed before a single byte of response arrived
    truncated,  // reset or closed in the middle of a response
    timeout,    // no complete response within the bound
    error,      // anything else (errno in `error`)
  };
  Outcome outcome = Outcome::error;
  int status = 0;
  std::string headers;  // as received, lower-cased names
  std::string body;
  int error = 0;
  Clock::time_point started;  // before connect()
  Clock::time_point sent;     // the whole request written
  Clock::time_point ended;

  [[nodiscard]] std::string header(const std::string& name) const {
    const std::string key = "\n" + name + ":";
    const auto pos = headers.find(key);
    if (pos == std::string::npos) return {};
    auto begin = pos + key.size();
    while (begin < headers.size() && headers[begin] == ' ') ++begin;
    return headers.substr(begin, headers.find('\r', begin) - begin);
  }
};

inline const char* to_string(Exchange::Outcome o) {
  switch (o) {
    case Exchange::Outcome::response:
      return "response";
    case Exchange::Outcome::refused:
      return "refused";
    case Exchange::Outcome::reset:
      return "reset";
    case Exchange::Outcome::truncated:
      return "truncated";
    case Exchange::Outcome::timeout:
      return "timeout";
    case Exchange::Outcome::error:
      return "error";
  }
  return "?";
}

class Socket {
 public:
  explicit Socket(int fd = -1) noexcept : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    reset();
    fd_ = std::exchange(o.fd_, -1);
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }
  [[nodiscard]] int fd() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// Connects to 127.0.0.1:port; errno is kept on failure.
inline Socket connect_to(int port) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.fd() < 0) return s;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int one = 1;
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    s.reset();
    errno = err;
  }
  return s;
}

// Waits (at most 3 minutes) until the kernel's connection-tracking table,
// if the machine has one, has room for `connections` more.
//
// Where netfilter tracks connections (any machine with NAT rules), every
// closed loopback connection keeps an entry for 2 minutes
// (nf_conntrack_tcp_timeout_time_wait) and a full table drops new SYNs: the
// client's connect() then stalls for a second or more per retry. A load test
// opening ten thousand connections a run fills a 262,144-entry table when it
// is repeated back to back; it waits here instead of failing on the kernel.
inline void wait_for_connection_tracking_room(std::size_t connections) {
  const auto read = [](const char* path) -> std::optional<std::size_t> {
    std::FILE* f = std::fopen(path, "r");
    if (f == nullptr) return std::nullopt;
    unsigned long long v = 0;
    const bool ok = std::fscanf(f, "%llu", &v) == 1;
    std::fclose(f);
    if (!ok) return std::nullopt;
    return static_cast<std::size_t>(v);
  };
  const auto max = read("/proc/sys/net/netfilter/nf_conntrack_max");
  if (!max) return;  // no connection tracking
  const auto deadline = Clock::now() + 180s;
  bool told = false;
  while (Clock::now() < deadline) {
    const auto count = read("/proc/sys/net/netfilter/nf_conntrack_count");
    if (!count || *count + connections <= *max) return;
    if (!told) {
      std::printf("[ harness  ] waiting for room in the connection-tracking table (%zu of %zu)\n",
                  *count, *max);
      told = true;
    }
    std::this_thread::sleep_for(1s);
  }
}

inline bool write_all(int fd, std::string_view data, int& err) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      return false;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// Parses `raw` if it holds a complete response; returns false if more bytes
// are needed.
inline bool parse_response(const std::string& raw, Exchange& ex, bool head_request) {
  const auto end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return false;
  std::string head = raw.substr(0, end + 2);
  if (head.rfind("HTTP/1.", 0) != 0 || head.size() < 12) return false;
  // Header names are case-insensitive: lower-case them, not the values.
  bool in_name = false;
  for (auto& ch : head) {
    if (ch == '\n') {
      in_name = true;
    } else if (ch == ':') {
      in_name = false;
    } else if (in_name) {
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    }
  }
  ex.status = std::atoi(head.c_str() + 9);
  ex.headers = "\n" + head.substr(head.find("\r\n") + 2);
  std::size_t length = 0;
  const std::string cl = ex.header("content-length");
  if (!cl.empty() && !head_request) {
    length = static_cast<std::size_t>(std::strtoull(cl.c_str(), nullptr, 10));
  }
  if (raw.size() < end + 4 + length) return false;
  ex.body = raw.substr(end + 4, length);
  return true;
}

// Reads from `fd` into `raw` until `raw` starts with a complete response
// (parsed into `ex`), the peer closes, or `deadline` passes. Bytes that
// follow the response stay in `raw` (pipelining). A response to HEAD has
// no body, whatever its Content-Length says.
inline void read_response(int fd, std::string& raw, Exchange& ex, Clock::time_point deadline,
                          bool head_request) {
  char buf[16384];
  while (true) {
    if (parse_response(raw, ex, head_request)) {
      ex.outcome = Exchange::Outcome::response;
      break;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      ex.outcome = Exchange::Outcome::timeout;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;  // re-checks the deadline
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      raw.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    ex.error = n < 0 ? errno : 0;
    ex.outcome = raw.empty() ? Exchange::Outcome::reset : Exchange::Outcome::truncated;
    break;
  }
  ex.ended = Clock::now();
}

// Reads one response from `fd` (bounded by `deadline`).
inline void read_response(int fd, Exchange& ex, Clock::time_point deadline,
                          bool head_request = false) {
  std::string raw;
  read_response(fd, raw, ex, deadline, head_request);
}

// One request on a fresh connection; `request` is the full request text.
inline Exchange send_request(int port, const std::string& request,
                             std::chrono::milliseconds bound = 10'000ms) {
  Exchange ex;
  ex.started = Clock::now();
  const auto deadline = ex.started + bound * kSlowdown;
  Socket s = connect_to(port);
  if (s.fd() < 0) {
    ex.error = errno;
    ex.outcome = ex.error == ECONNREFUSED ? Exchange::Outcome::refused : Exchange::Outcome::error;
    ex.sent = ex.ended = Clock::now();
    return ex;
  }
  if (!write_all(s.fd(), request, ex.error)) {
    ex.sent = ex.ended = Clock::now();
    ex.outcome = (ex.error == ECONNRESET || ex.error == EPIPE) ? Exchange::Outcome::reset
                                                               : Exchange::Outcome::error;
    return ex;
  }
  ex.sent = Clock::now();
  read_response(s.fd(), ex, deadline, request.rfind("HEAD ", 0) == 0);
  return ex;
}

inline std::string request_text(const std::string& method, const std::string& target,
                                const std::string& body = {},
                                const std::string& extra_headers = {}) {
  std::string r = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!body.empty() || method == "POST") {
    r +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  r += extra_headers + "\r\n" + body;
  return r;
}

inline Exchange get(int port, const std::string& target) {
  return send_request(port, request_text("GET", target));
}

inline Exchange post(int port, const std::string& target, const std::string& body) {
  return send_request(port, request_text("POST", target, body));
}

// Joins the threads still joinable when it goes out of scope: threads
// that talk to a crewd end before the crewd object (declared before them)
// is destroyed.
struct JoinAll {
  std::vector<std::thread>& threads;
  ~JoinAll() {
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  }
};

// Each thread of `pid` as (name, value): `value_of(tid, fields)` reads the
// value from the thread's id and the fields of its /proc/PID/task/TID/stat
// after "(comm) "; a thread that ended meanwhile, or whose value it cannot
// read (nullopt), is left out.
template <class ValueOf>
inline std::vector<std::pair<std::string, int>> thread_values(pid_t pid, ValueOf value_of) {
  std::vector<std::pair<std::string, int>> out;
  std::error_code ec;
  for (const auto& t :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::FILE* f = std::fopen((t.path() / "stat").c_str(), "r");
    if (f == nullptr) continue;  // the thread ended meanwhile
    char buf[1024];
    const std::size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    const std::string stat(buf, n);
    const auto open = stat.find('(');
    const auto close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    const std::optional<int> value = value_of(
        static_cast<pid_t>(std::stoi(t.path().filename().string())), stat.substr(close + 2));
    if (value) out.emplace_back(stat.substr(open + 1, close - open - 1), *value);
  }
  return out;
}

// crewd as a child process. Its stderr (the log) is collected by a thread;
// the destructor kills a crewd that is still running.
class Crewd {
 public:
  // `args` after the program name; `env` adds to the test's environment;
  // `nofile`, if not 0, is crewd's descriptor limit (soft and hard);
  // `launcher`, if not empty, is a command (its first word a full path)
  // that execs crewd in its own place, e.g. {"/usr/bin/taskset", "-c", "0"}.
  explicit Crewd(std::vector<std::string> args, std::map<std::string, std::string> env = {},
                 rlim_t nofile = 0, std::vector<std::string> launcher = {}) {
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    std::vector<std::string> argv_s = std::move(launcher);
    argv_s.push_back(crew::test::beside_this_test(CREWD_BINARY));
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s;
    for (char** e = environ; *e != nullptr; ++e) env_s.emplace_back(*e);
    for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork");
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec. A test that
      // dies (a failed assertion that aborts) takes its crewd with it.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (nofile != 0) {
        const rlimit limit{.rlim_cur = nofile, .rlim_max = nofile};
        if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(126);
      }
      ::dup2(pipe_fds[1], STDERR_FILENO);
      ::dup2(pipe_fds[1], STDOUT_FILENO);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(pipe_fds[1]);
    reader_ = std::thread([this, fd = pipe_fds[0]] { read_log(fd); });
  }
  Crewd(const Crewd&) = delete;
  Crewd& operator=(const Crewd&) = delete;
  ~Crewd() {
    if (!exited_) {
      ::kill(pid_, SIGKILL);
      (void)wait_exit(10s);
    }
    reader_.join();
  }

  // The port from the "listening on http://HOST:PORT" line; 0 if crewd
  // exited or did not log it in time.
  int wait_port(std::chrono::milliseconds bound = 10'000ms) {
    std::vector<std::string> groups;
    const std::string line = wait_log("listening on http://[^:]+:([0-9]+)", bound, &groups);
    return line.empty() ? 0 : std::stoi(groups[1]);
  }

  // Waits until a log line matches `pattern` (search() in
  // text_search.hpp); returns it (empty if crewd exited or `bound` passed
  // first), and the match's groups in `groups` when given.
  std::string wait_log(const std::string& pattern, std::chrono::milliseconds bound,
                       std::vector<std::string>* groups = nullptr) {
    std::unique_lock lock(mu_);
    const auto deadline = Clock::now() + bound * kSlowdown;
    std::size_t checked = 0;
    while (true) {
      for (; checked < lines_.size(); ++checked) {
        if (auto found = search(lines_[checked], pattern)) {
          if (groups != nullptr) *groups = std::move(*found);
          return lines_[checked];
        }
      }
      if (log_closed_ || Clock::now() >= deadline) return {};
      cv_.wait_until(lock, deadline);
    }
  }

  // Everything crewd wrote, once its end of the pipe is closed (bounded).
  std::string full_log(std::chrono::milliseconds bound = 5'000ms) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, bound * kSlowdown, [this] { return log_closed_; });
    std::string all;
    for (const auto& l : lines_) all += l + "\n";
    return all;
  }

  [[nodiscard]] std::string log() const {
    std::lock_guard lock(mu_);
    std::string all;
    for (const auto& l : lines_) all += l + "\n";
    return all;
  }

  void signal(int signo) { ::kill(pid_, signo); }

  // The wait status once crewd exited within `bound`.
  std::optional<int> wait_exit(std::chrono::milliseconds bound) {
    const auto deadline = Clock::now() + bound;
    while (true) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        exit_time_ = Clock::now();
        return status;
      }
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(1ms);
    }
  }
  [[nodiscard]] Clock::time_point exit_time() const { return exit_time_; }
  [[nodiscard]] pid_t pid() const { return pid_; }

 private:
  void read_log(int fd) {
    std::string partial;
    char buf[4096];
    while (true) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      partial.append(buf, static_cast<std::size_t>(n));
      std::size_t pos;
      std::lock_guard lock(mu_);
      while ((pos = partial.find('\n')) != std::string::npos) {
        lines_.push_back(partial.substr(0, pos));
        partial.erase(0, pos + 1);
      }
      cv_.notify_all();
    }
    ::close(fd);
    std::lock_guard lock(mu_);
    if (!partial.empty()) lines_.push_back(partial);
    log_closed_ = true;
    cv_.notify_all();
  }

  pid_t pid_ = -1;
  bool exited_ = false;
  Clock::time_point exit_time_{};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
  bool log_closed_ = false;
  std::thread reader_;
};

// Runs crewd with `args` to completion (for --help, --print-config, bad
// settings); returns the exit code and everything it printed.
inline std::pair<int, std::string> run_crewd(std::vector<std::string> args,
                                             std::map<std::string, std::string> env = {}) {
  Crewd c(std::move(args), std::move(env));
  const auto status = c.wait_exit(20s * kSlowdown);
  if (!status) return {-1, c.log()};
  return {WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status), c.full_log()};
}

}  // namespace crewd::test
