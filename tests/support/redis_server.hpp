// tests/support/redis_server.hpp: a redis-server started for one test on a free
// loopback port (Debian's redis-server; scripts/deps.sh installs it), with
// a small client for the test's own checks. Stopped with the object.
#pragma once

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace crew::test {

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("no free port");
  }
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

class RedisServer {
 public:
  // `appendonly`: persist to an append-only file, so data survives restart().
  explicit RedisServer(bool appendonly = false)
      : port_(free_port()),
        dir_(std::filesystem::temp_directory_path() /
             ("crew-redis-" + std::to_string(::getpid()) + "-" + std::to_string(port_))),
        appendonly_(appendonly) {
    std::filesystem::create_directories(dir_);
    start();
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  ~RedisServer() {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  [[nodiscard]] int port() const noexcept { return port_; }

  void start() {
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string port = std::to_string(port_);
      const std::string dir = dir_.string();
      ::execlp(CREW_REDIS_SERVER, CREW_REDIS_SERVER, "--port", port.c_str(), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", appendonly_ ? "yes" : "no", "--appendfsync", "always",
               "--dir", dir.c_str(), "--loglevel", "warning", static_cast<char*>(nullptr));
      std::_Exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (command({"PING"}) == "PONG") return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw std::runtime_error("redis-server did not start");
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  // One command; the reply as text (a string, status or error), its integer
  // as text, the number of elements of an array, or "" for nil / no reply.
  std::string command(const std::vector<std::string>& args) {
    redisReply* r = raw(args);
    std::string out;
    if (r != nullptr) {
      if (r->type == REDIS_REPLY_INTEGER) {
        out = std::to_string(r->integer);
      } else if (r->type == REDIS_REPLY_ARRAY) {
        out = std::to_string(r->elements);
      } else if (r->str != nullptr) {
        out.assign(r->str, r->len);
      }
      freeReplyObject(r);
    }
    return out;
  }

  // The caller frees the reply (freeReplyObject). Null if unreachable.
  redisReply* raw(const std::vector<std::string>& args) {
    timeval tv{2, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (c == nullptr || c->err != 0) {
      if (c != nullptr) redisFree(c);
      return nullptr;
    }
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    redisFree(c);
    return r;
  }

 private:
  int port_;
  std::filesystem::path dir_;
  bool appendonly_;
  pid_t pid_ = -1;
};

}  // namespace crew::test
