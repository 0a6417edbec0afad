// graceful_consumer: events from a library we do not control, handled on a
// pool, and not one of them lost when the process is told to stop.
//
//   graceful_consumer --out FILE
//
// A simulated third-party producer calls our callback with one event at a
// time (ids 1, 2, 3, ...) and waits for it to return; the callback hands the
// event to a pool, blocking while the pool's small queue is full. Each task
// calls a slow "external service" (a sleep of 50-150 ms, one call in ten
// fails) and appends "<event id> <outcome>" to FILE.
//
// On SIGTERM (or SIGINT, SIGHUP, SIGQUIT) the application halts: the callback
// refuses further events, so the producer stops delivering; main returns; the
// application drains the pool (every accepted event is processed and its
// outcome written) and then closes the file. The last line on stdout is
// "accepted N written M"; on a clean exit (status 0) M equals N. The
// application's log, with timestamps, goes to stderr.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <crew/application.hpp>
#include <crew/pool.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

using namespace std::chrono_literals;

namespace {

const auto g_start = std::chrono::steady_clock::now();

double seconds_since_start() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
}

// The file the outcomes go to, as a resource of the application: opened
// before main runs, checked while it runs, synced and closed after the pool
// has drained.
class OutcomeFile final : public crew::Resource {
 public:
  explicit OutcomeFile(std::string path) : path_(std::move(path)) {}

  void init(const crew::ResourceCall&) override {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) throw std::runtime_error("open " + path_ + ": " + std::strerror(errno));
  }
  void ping(const crew::ResourceCall&) override {
    if (write_errors_.load() > 0) throw std::runtime_error("writes to " + path_ + " fail");
    struct stat st {};
    if (::fstat(fd_, &st) != 0)
      throw std::runtime_error("fstat: " + std::string(std::strerror(errno)));
  }
  void close(const crew::ResourceCall&) override {
    const bool synced = ::fsync(fd_) == 0;
    ::close(fd_);
    if (!synced) throw std::runtime_error("fsync " + path_ + ": " + std::strerror(errno));
  }

  // One write(2) per line: with O_APPEND, lines from concurrent tasks never
  // interleave.
  void append(std::uint64_t id, const char* outcome) {
    const std::string line = std::to_string(id) + " " + outcome + "\n";
    if (::write(fd_, line.data(), line.size()) == static_cast<ssize_t>(line.size())) {
      written_.fetch_add(1);
    } else {
      write_errors_.fetch_add(1);
    }
  }
  [[nodiscard]] std::uint64_t written() const { return written_.load(); }

 private:
  std::string path_;
  int fd_ = -1;
  std::atomic<std::uint64_t> written_{0};
  std::atomic<std::uint64_t> write_errors_{0};
};

// Stands in for the third-party library: it calls the callback with each
// new event, one at a time, and stops when an event is refused.
class Producer {
 public:
  explicit Producer(std::function<bool(std::uint64_t)> callback)
      : thread_([cb = std::move(callback)] {
          for (std::uint64_t id = 1; cb(id); ++id) std::this_thread::sleep_for(5ms);
        }) {}
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;
  ~Producer() { thread_.join(); }

 private:
  std::thread thread_;
};

// The slow external service: 50-150 ms per call, one call in ten fails.
bool call_external_service(std::uint64_t id) {
  thread_local std::mt19937 rng(std::random_device{}());
  std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 101));
  return id % 10 != 0;
}

// Log lines with the seconds since start, so the stop can be timed.
class TimedLogger final : public crew::Logger {
 public:
  void log(crew::LogLevel level, const crew::LogContext& ctx,
           std::string_view message) noexcept override {
    try {
      const std::string about = ctx.pool.empty() ? "" : "pool " + std::string(ctx.pool) + ": ";
      std::fprintf(stderr, "[%8.3f] %s %s%.*s\n", seconds_since_start(),
                   std::string(crew::to_string(level)).c_str(), about.c_str(),
                   static_cast<int>(message.size()), message.data());
    } catch (...) {  // out of memory: drop the line
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
      out = argv[++i];
    } else {
      out.clear();
      break;
    }
  }
  if (out.empty()) {
    std::fprintf(stderr, "usage: graceful_consumer --out FILE\n");
    return 2;
  }

  auto file = std::make_shared<OutcomeFile>(out);
  const auto logger = std::make_shared<TimedLogger>();
  // Four workers and a queue of four, like a channel buffered to the number
  // of workers: the producer blocks in the callback when both are full.
  crew::Pool pool({.name = "events",
                   .max_workers = 4,
                   .queue_capacity = 4,
                   .overflow = crew::Overflow::block,
                   .shutdown_mode = crew::ShutdownMode::drain,
                   .shutdown_timeout = 10s,
                   .logger = logger});
  crew::Application app({.name = "consumer",
                         .init_timeout = 5s,
                         .termination_timeout = 5s,
                         .shutdown_timeout = 5s,
                         .ping_period = 1s,
                         .ping_timeout = 500ms,
                         .logger = logger});
  app.add_resource(file, {.name = "outcome-file"});
  app.add_pool(pool);

  std::atomic<std::uint64_t> accepted{0};
  const int code = app.run([&](const crew::Context& ctx) {
    std::printf("consuming; outcomes go to %s\n", out.c_str());
    std::fflush(stdout);
    {
      Producer producer([&](std::uint64_t id) {
        // Halting: take no new event. One that slips past this check is
        // still accepted by the pool, and the drain processes it.
        if (ctx.halting()) return false;
        const crew::Admission a = pool.post(
            [id, f = file.get()] { f->append(id, call_external_service(id) ? "ok" : "failed"); });
        if (a != crew::Admission::accepted) return false;
        accepted.fetch_add(1);
        return true;
      });
      std::mutex mu;
      std::condition_variable_any cv;
      std::unique_lock lock(mu);
      cv.wait(lock, ctx.halt_token(), [] { return false; });
    }  // the producer has seen a refusal and stopped
    ctx.log(crew::LogLevel::info,
            "producer stopped after " + std::to_string(accepted.load()) + " events");
  });

  std::printf("accepted %llu written %llu\n", static_cast<unsigned long long>(accepted.load()),
              static_cast<unsigned long long>(file->written()));
  std::fflush(stdout);
  return code;
}
