// service/tests/crewd_redis_client.hpp: the Redis side of crewd_redis_test:
// the test's own hiredis connection (Client, which reconnects after a Redis
// restart), and a reader of a results or dead-letter stream as it grows
// (StreamReader). Every call is bounded by the connection's timeouts.
#pragma once

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crewd_harness.hpp"

namespace crewd::test {

// A job's fields, in order.
using Fields = std::vector<std::pair<std::string, std::string>>;

struct ReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

inline std::string str(const redisReply* r) {
  if (r == nullptr) return {};
  if (r->type == REDIS_REPLY_INTEGER) return std::to_string(r->integer);
  return r->str == nullptr ? std::string() : std::string(r->str, r->len);
}

// The test's own connection; reconnects after a Redis restart.
class Client {
 public:
  explicit Client(int port) : port_(port) {}
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client() { reset(); }

  // Null if Redis is unreachable.
  Reply run(const std::vector<std::string>& args) {
    if (!ensure()) return nullptr;
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    Reply r(static_cast<redisReply*>(
        redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (!r) reset();
    return r;
  }

  long long integer(const std::vector<std::string>& args) {
    const Reply r = run(args);
    return r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
  }

  // n entries with `fields`, XADDed in pipelined batches; their ids.
  std::vector<std::string> enqueue(int n, const Fields& fields) {
    std::vector<std::string> ids;
    std::vector<std::string> args = {"XADD", "crew:jobs", "*"};
    for (const auto& [k, v] : fields) {
      args.push_back(k);
      args.push_back(v);
    }
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (!ensure()) return ids;
    for (int done = 0; done < n;) {
      const int batch = std::min(1000, n - done);
      for (int i = 0; i < batch; ++i) {
        redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data());
      }
      for (int i = 0; i < batch; ++i) {
        void* r = nullptr;
        if (redisGetReply(ctx_, &r) != REDIS_OK) {
          ADD_FAILURE() << "XADD " << ids.size() << " of " << n << ": " << ctx_->errstr;
          reset();
          return ids;
        }
        const Reply reply(static_cast<redisReply*>(r));
        ids.push_back(str(reply.get()));
      }
      done += batch;
    }
    return ids;
  }

  // Entries of the group not yet acknowledged (of one consumer, if given).
  long long pending(const std::string& consumer = {}) {
    if (consumer.empty()) {
      const Reply r = run({"XPENDING", "crew:jobs", "crew"});
      return r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 ? r->element[0]->integer : -1;
    }
    return static_cast<long long>(pending_ids(consumer).size());
  }

  std::vector<std::string> pending_ids(const std::string& consumer) {
    std::vector<std::string> ids;
    const Reply r = run({"XPENDING", "crew:jobs", "crew", "-", "+", "1000000", consumer});
    for (std::size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; ++i) {
      ids.push_back(str(r->element[i]->element[0]));
    }
    return ids;
  }

  // A field of the group's XINFO GROUPS entry (lag, pending, ...); -1 if absent.
  long long group_info(const std::string& field) {
    const Reply r = run({"XINFO", "GROUPS", "crew:jobs"});
    for (std::size_t g = 0; r && r->type == REDIS_REPLY_ARRAY && g < r->elements; ++g) {
      const redisReply* info = r->element[g];
      for (std::size_t k = 0; k + 1 < info->elements; k += 2) {
        if (str(info->element[k]) == field && info->element[k + 1]->type == REDIS_REPLY_INTEGER) {
          return info->element[k + 1]->integer;
        }
      }
    }
    return -1;
  }

  // Calls per command since the last CONFIG RESETSTAT ("xadd" -> n).
  std::map<std::string, long long> command_calls() {
    std::map<std::string, long long> calls;
    const Reply r = run({"INFO", "commandstats"});
    const std::string text = str(r.get());
    std::size_t pos = 0;
    while ((pos = text.find("cmdstat_", pos)) != std::string::npos) {
      const auto colon = text.find(':', pos);
      const auto eq = text.find("calls=", colon);
      calls[text.substr(pos + 8, colon - pos - 8)] = std::atoll(text.c_str() + eq + 6);
      pos = colon;
    }
    return calls;
  }

  // Redis' clock in ms (the clock of stream entry ids).
  long long now_ms() {
    const Reply r = run({"TIME"});
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) return -1;
    return std::atoll(r->element[0]->str) * 1000 + std::atoll(r->element[1]->str) / 1000;
  }

  // CPU time of the server (user + system), from INFO cpu.
  double cpu_seconds() {
    const std::string info = str(run({"INFO", "cpu"}).get());
    double total = 0;
    for (const char* key : {"used_cpu_sys:", "used_cpu_user:"}) {
      const auto p = info.find(key);
      if (p != std::string::npos) total += std::atof(info.c_str() + p + std::strlen(key));
    }
    return total;
  }

  long long server_pid() {
    const std::string info = str(run({"INFO", "server"}).get());
    const auto p = info.find("process_id:");
    return p == std::string::npos ? -1 : std::atoll(info.c_str() + p + 11);
  }

 private:
  bool ensure() {
    if (ctx_ != nullptr) return true;
    // Generous: with appendonly, Redis' writes to its file can stall for
    // seconds while the disk is busy (a parallel build, the rest of the
    // suite); a reply that late is slow, not lost.
    timeval tv{10 * kSlowdown, 0};
    ctx_ = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (ctx_ == nullptr || ctx_->err != 0) {
      reset();
      return false;
    }
    redisSetTimeout(ctx_, tv);
    return true;
  }
  void reset() {
    if (ctx_ != nullptr) redisFree(ctx_);
    ctx_ = nullptr;
  }

  int port_;
  redisContext* ctx_ = nullptr;
};

// Milliseconds of a stream entry id (the Redis server's clock when written).
inline long long id_ms(const std::string& id) { return std::atoll(id.c_str()); }

struct Outcome {
  std::string id;  // the results entry's own id: <ms>-<seq>, when it was written
  std::string job, status, value, instance;
  int attempt = 0;
};

// Reads a results (or dead-letter) stream as it grows.
class StreamReader {
 public:
  StreamReader(Client& client, std::string stream) : client_(client), stream_(std::move(stream)) {}

  // Reads what was added since the last call; false if Redis did not answer.
  bool poll() {
    while (true) {
      const Reply r = client_.run(
          {"XRANGE", stream_, last_.empty() ? "-" : "(" + last_, "+", "COUNT", "20000"});
      if (!r || r->type != REDIS_REPLY_ARRAY) return false;
      for (std::size_t i = 0; i < r->elements; ++i) {
        const redisReply* e = r->element[i];
        Outcome o;
        o.id = str(e->element[0]);
        const redisReply* kv = e->element[1];
        for (std::size_t k = 0; k + 1 < kv->elements; k += 2) {
          const std::string key = str(kv->element[k]);
          const std::string val = str(kv->element[k + 1]);
          if (key == "job") o.job = val;
          if (key == "status") o.status = val;
          if (key == "attempt") o.attempt = std::atoi(val.c_str());
          if (key == "result" || key == "error") o.value = val;
          if (key == "instance") o.instance = val;
        }
        last_ = o.id;
        if (++per_job_[o.job] == 1) first_ms_[o.job] = id_ms(o.id);
        all_.push_back(std::move(o));
      }
      if (r->elements < 20000) return true;
    }
  }

  [[nodiscard]] std::size_t distinct() const { return per_job_.size(); }
  [[nodiscard]] std::size_t total() const { return all_.size(); }
  [[nodiscard]] bool has(const std::string& job) const { return per_job_.count(job) != 0; }
  // When the job's first result was written, on Redis' clock (ms).
  [[nodiscard]] long long first_ms(const std::string& job) const { return first_ms_.at(job); }
  [[nodiscard]] const std::vector<Outcome>& all() const { return all_; }

  // Polls until `pred` holds or `bound` passes.
  bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds bound) {
    const auto deadline = Clock::now() + bound * kSlowdown;
    while (true) {
      poll();
      if (pred()) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(10ms);
    }
  }

 private:
  Client& client_;
  std::string stream_;
  std::string last_;
  std::unordered_map<std::string, int> per_job_;
  std::unordered_map<std::string, long long> first_ms_;
  std::vector<Outcome> all_;
};

constexpr auto kClaimIdle = 1000ms;

}  // namespace crewd::test
