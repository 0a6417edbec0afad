// src/redis/redis_conn.hpp (private): one synchronous hiredis connection, used by
// one thread at a time (the caller provides the exclusion).
#pragma once

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace crew::detail {

struct ReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

// The text of a string, status or error reply.
inline std::string_view text_of(const redisReply* r) noexcept {
  return r == nullptr || r->str == nullptr ? std::string_view{} : std::string_view(r->str, r->len);
}

class RedisConn {
 public:
  RedisConn(std::string host, int port, std::string password, std::chrono::milliseconds timeout)
      : host_(std::move(host)), port_(port), password_(std::move(password)), timeout_(timeout) {}
  RedisConn(const RedisConn&) = delete;
  RedisConn& operator=(const RedisConn&) = delete;
  ~RedisConn() { close(); }

  [[nodiscard]] bool connected() const noexcept { return ctx_ != nullptr; }
  [[nodiscard]] const std::string& error() const noexcept { return error_; }

  // Connects (and authenticates) if not connected. False on failure.
  bool ensure() {
    if (ctx_ != nullptr) return true;
    redisContext* c = redisConnectWithTimeout(host_.c_str(), port_, timeval_of(timeout_));
    if (c == nullptr || c->err != 0) {
      error_ = c == nullptr ? "out of memory" : c->errstr;
      if (c != nullptr) redisFree(c);
      return false;
    }
    ctx_ = c;
    set_timeout(timeout_);
    if (!password_.empty()) {
      Reply r = command({"AUTH", password_});
      if (!r || r->type == REDIS_REPLY_ERROR) {
        error_ = r ? std::string(text_of(r.get())) : error_;
        close();
        return false;
      }
    }
    return true;
  }

  void close() noexcept {
    if (ctx_ != nullptr) redisFree(ctx_);
    ctx_ = nullptr;
  }

  // Socket timeout of the next commands (a blocking read adds its block time).
  void set_timeout(std::chrono::milliseconds t) noexcept {
    if (ctx_ != nullptr) redisSetTimeout(ctx_, timeval_of(t));
  }

  // One command. An empty Reply means the connection failed (now closed);
  // a Redis error comes back as a reply of type REDIS_REPLY_ERROR.
  Reply command(const std::vector<std::string>& args) {
    if (!ensure()) return Reply{};
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    argv.reserve(args.size());
    lens.reserve(args.size());
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (r == nullptr) fail();
    return Reply(r);
  }

  // Several commands in one round trip; all replies, or false if the
  // connection failed (then closed).
  bool pipeline(const std::vector<std::vector<std::string>>& commands, std::vector<Reply>& out) {
    out.clear();
    if (!ensure()) return false;
    for (const auto& args : commands) {
      std::vector<const char*> argv;
      std::vector<std::size_t> lens;
      for (const std::string& a : args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()) !=
          REDIS_OK) {
        fail();
        return false;
      }
    }
    for (std::size_t i = 0; i < commands.size(); ++i) {
      void* r = nullptr;
      if (redisGetReply(ctx_, &r) != REDIS_OK || r == nullptr) {
        fail();
        return false;
      }
      out.emplace_back(static_cast<redisReply*>(r));
    }
    return true;
  }

 private:
  static timeval timeval_of(std::chrono::milliseconds t) noexcept {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(t.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
    return tv;
  }
  void fail() noexcept {
    error_ = ctx_ != nullptr && ctx_->errstr[0] != '\0' ? ctx_->errstr : "connection lost";
    close();
  }

  std::string host_;
  int port_;
  std::string password_;
  std::chrono::milliseconds timeout_;
  redisContext* ctx_ = nullptr;
  std::string error_;
};

}  // namespace crew::detail
