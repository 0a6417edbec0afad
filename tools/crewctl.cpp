// crewctl: enqueue jobs into the Redis stream crewd instances consume, and
// report their results, dead letters and the consumer group's state.
//
//   crewctl [--redis HOST:PORT] [--stream S] [--group G] [--results R] [--dead D]
//           enqueue --kind sleep|spin --ms N [--timeout-ms M] [--name X] [--count C]
//           results [--count N]      last N results (all with --count 0)
//           dead    [--count N]      last N dead letters
//           status                   stream length, pending, lag, consumers
//
// The job fields are those of POST /api/v1/jobs: kind, ms, timeout_ms, name.
// Exit codes: 0 ok, 1 Redis error or unreachable, 2 bad arguments.
#include <hiredis/hiredis.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

struct ReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;
struct ContextFree {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};

class Redis {
 public:
  Redis(const std::string& host, int port) {
    timeval tv{3, 0};
    ctx_.reset(redisConnectWithTimeout(host.c_str(), port, tv));
    if (!ctx_ || ctx_->err != 0) {
      throw std::runtime_error("cannot reach Redis at " + host + ":" + std::to_string(port) + ": " +
                               (ctx_ ? ctx_->errstr : "out of memory"));
    }
  }
  Reply run(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(ctx_.get(), static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (r == nullptr) throw std::runtime_error(std::string("Redis: ") + ctx_->errstr);
    if (r->type == REDIS_REPLY_ERROR) {
      const std::string msg(r->str, r->len);
      freeReplyObject(r);
      throw std::runtime_error("Redis: " + msg);
    }
    return Reply(r);
  }

 private:
  std::unique_ptr<redisContext, ContextFree> ctx_;
};

std::string str(const redisReply* r) {
  if (r == nullptr) return {};
  if (r->type == REDIS_REPLY_INTEGER) return std::to_string(r->integer);
  return r->str == nullptr ? std::string() : std::string(r->str, r->len);
}

// Prints "<entry id> key=value ..." per entry of an XRANGE / XREVRANGE reply,
// oldest first.
void print_entries(const redisReply* r, bool reversed) {
  if (r == nullptr || r->type != REDIS_REPLY_ARRAY) return;
  for (std::size_t n = 0; n < r->elements; ++n) {
    const redisReply* e = r->element[reversed ? r->elements - 1 - n : n];
    std::string line = str(e->element[0]);
    const redisReply* kv = e->element[1];
    for (std::size_t k = 0; k + 1 < kv->elements; k += 2) {
      line += " " + str(kv->element[k]) + "=" + str(kv->element[k + 1]);
    }
    std::printf("%s\n", line.c_str());
  }
}

void print_last(Redis& redis, const std::string& stream, int count) {
  if (count <= 0) {
    print_entries(redis.run({"XRANGE", stream, "-", "+"}).get(), false);
  } else {
    print_entries(redis.run({"XREVRANGE", stream, "+", "-", "COUNT", std::to_string(count)}).get(),
                  true);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"crewctl: enqueue crewd jobs into Redis and read their outcomes"};
  app.require_subcommand(1);
  std::string address = "127.0.0.1:6379";
  std::string stream = "crew:jobs", group = "crew", results = "crew:results", dead = "crew:dead";
  app.add_option("--redis", address, "Redis address HOST:PORT")->capture_default_str();
  app.add_option("--stream", stream, "jobs stream")->capture_default_str();
  app.add_option("--group", group, "consumer group")->capture_default_str();
  app.add_option("--results", results, "results stream")->capture_default_str();
  app.add_option("--dead", dead, "dead-letter stream")->capture_default_str();

  auto* enqueue = app.add_subcommand("enqueue", "add jobs to the stream; prints their ids");
  std::string kind, name;
  long ms = -1, timeout_ms = -1, count = 1;
  enqueue->add_option("--kind", kind, "sleep or spin")
      ->required()
      ->check(CLI::IsMember({"sleep", "spin"}));
  enqueue->add_option("--ms", ms, "how long the job runs")
      ->required()
      ->check(CLI::NonNegativeNumber);
  enqueue->add_option("--timeout-ms", timeout_ms, "its deadline")->check(CLI::PositiveNumber);
  enqueue->add_option("--name", name, "its name (metrics, reports)");
  enqueue->add_option("--count", count, "how many")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  int shown = 20;
  auto* show_results = app.add_subcommand("results", "print the last results");
  show_results->add_option("--count", shown, "how many; 0 for all")->capture_default_str();
  auto* show_dead = app.add_subcommand("dead", "print the last dead letters");
  show_dead->add_option("--count", shown, "how many; 0 for all")->capture_default_str();
  auto* status = app.add_subcommand("status", "stream length, pending, lag, consumers");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  const auto colon = address.rfind(':');
  int port = 0;
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no port");
    port = std::stoi(address.substr(colon + 1));
    if (port <= 0 || port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    std::fprintf(stderr, "crewctl: --redis must be HOST:PORT, not '%s'\n", address.c_str());
    return 2;
  }

  try {
    Redis redis(address.substr(0, colon), port);
    if (*enqueue) {
      for (long i = 0; i < count; ++i) {
        std::vector<std::string> args = {
            "XADD", stream, "*", "kind", kind, "ms", std::to_string(ms)};
        if (timeout_ms > 0) {
          args.push_back("timeout_ms");
          args.push_back(std::to_string(timeout_ms));
        }
        if (!name.empty()) {
          args.push_back("name");
          args.push_back(name);
        }
        std::printf("%s\n", str(redis.run(args).get()).c_str());
      }
    } else if (*show_results) {
      print_last(redis, results, shown);
    } else if (*show_dead) {
      print_last(redis, dead, shown);
    } else if (*status) {
      std::printf("stream %s: %s entries\n", stream.c_str(),
                  str(redis.run({"XLEN", stream}).get()).c_str());
      std::printf("results %s: %s entries\n", results.c_str(),
                  str(redis.run({"XLEN", results}).get()).c_str());
      std::printf("dead letters %s: %s entries\n", dead.c_str(),
                  str(redis.run({"XLEN", dead}).get()).c_str());
      const Reply groups = redis.run({"XINFO", "GROUPS", stream});
      for (std::size_t g = 0; g < groups->elements; ++g) {
        const redisReply* info = groups->element[g];
        std::string line = "group";
        for (std::size_t k = 0; k + 1 < info->elements; k += 2) {
          line += " " + str(info->element[k]) + "=" + str(info->element[k + 1]);
        }
        std::printf("%s\n", line.c_str());
      }
      const Reply consumers = redis.run({"XINFO", "CONSUMERS", stream, group});
      for (std::size_t c = 0; c < consumers->elements; ++c) {
        const redisReply* info = consumers->element[c];
        std::string line = "consumer";
        for (std::size_t k = 0; k + 1 < info->elements; k += 2) {
          line += " " + str(info->element[k]) + "=" + str(info->element[k + 1]);
        }
        std::printf("%s\n", line.c_str());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "crewctl: %s\n", e.what());
    return 1;
  }
  return 0;
}
