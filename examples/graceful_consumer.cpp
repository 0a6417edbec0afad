// graceful_consumer: events from a library we do not control, each handled
// by a coroutine task that calls a slow service, and not one of them lost
// when the process is told to stop.
//
//   graceful_consumer --out FILE
//
// A simulated third-party producer calls our callback with one event at a
// time (ids 1, 2, 3, ...) and waits for it to return; the callback spawns a
// coroutine task for the event on a pool of 4 workers, blocking while 64
// events are in flight (the bound of the channel between the producer and
// the pool). Each task GETs /event/<id> from an HTTP service that this
// program starts on loopback, which answers after 1 s (one event in ten
// with a 500). While it waits for the answer the task holds no thread (an
// Asio client awaited with crew::on_callback), so 4 workers keep 64 calls
// in flight. The task then appends "<event id> <ok|failed>" to FILE.
//
// On SIGTERM (or SIGINT, SIGHUP, SIGQUIT) the application halts: the callback
// refuses further events, so the producer stops delivering; main returns; the
// application drains the pool (every accepted event's call completes and its
// outcome is written, within about 1 s) and then closes the file and the
// loopback service. The last line on stdout is
// "accepted N written M in_flight_max K"; on a clean exit (status 0) M equals
// N. The application's log, with timestamps, goes to stderr.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/buffers_iterator.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <crew/application.hpp>
#include <crew/coro.hpp>
#include <crew/pool.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <istream>
#include <memory>
#include <mutex>
#include <optional>
#include <semaphore>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

using namespace std::chrono_literals;
using boost::asio::ip::tcp;

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

// The slow service on loopback and the client's I/O, on one Asio thread, as
// a resource of the application: started before main runs, stopped after
// the pool has drained (no call is in flight by then).
class Loopback final : public crew::Resource {
 public:
  void init(const crew::ResourceCall&) override {
    acceptor_.open(tcp::v4());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    acceptor_.bind({boost::asio::ip::make_address("127.0.0.1"), 0});
    acceptor_.listen(1024);
    endpoint_ = acceptor_.local_endpoint();
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  void close(const crew::ResourceCall&) override {
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }
  [[nodiscard]] boost::asio::io_context& io() { return io_; }
  [[nodiscard]] tcp::endpoint endpoint() const { return endpoint_; }

 private:
  // One request to the service: its head is read, the answer goes 1 s later.
  struct Exchange {
    explicit Exchange(tcp::socket s) : socket(std::move(s)), timer(socket.get_executor()) {}
    tcp::socket socket;
    boost::asio::steady_timer timer;
    boost::asio::streambuf in;
    std::string out;
  };
  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket s) {
      if (ec) return;
      serve(std::make_shared<Exchange>(std::move(s)));
      accept();
    });
  }
  static void serve(const std::shared_ptr<Exchange>& x) {
    boost::asio::async_read_until(
        x->socket, x->in, "\r\n\r\n", [x](boost::system::error_code ec, std::size_t) {
          if (ec) return;
          // "GET /event/<id> HTTP/1.1": one event in ten fails.
          const std::string head(boost::asio::buffers_begin(x->in.data()),
                                 boost::asio::buffers_end(x->in.data()));
          const auto at = head.find("/event/");
          const unsigned long id =
              at == std::string::npos ? 0 : std::strtoul(head.c_str() + at + 7, nullptr, 10);
          x->out = id % 10 == 0 ? "HTTP/1.1 500 Failed\r\nContent-Length: 0\r\n\r\n"
                                : "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
          x->timer.expires_after(1s);
          x->timer.async_wait([x](boost::system::error_code) {
            boost::asio::async_write(x->socket, boost::asio::buffer(x->out),
                                     [x](boost::system::error_code, std::size_t) {});
          });
        });
  }

  boost::asio::io_context io_;
  // Keeps run() going between calls.
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{
      io_.get_executor()};
  tcp::acceptor acceptor_{io_};
  tcp::endpoint endpoint_;
  std::thread thread_;
};

// One GET to the service on a connection of its own, on the loopback's
// thread; hands the status code (0: no answer) to the waiting task.
class Call : public std::enable_shared_from_this<Call> {
 public:
  Call(boost::asio::io_context& io, tcp::endpoint to, std::uint64_t id)
      : socket_(io),
        to_(to),
        request_("GET /event/" + std::to_string(id) + " HTTP/1.1\r\nHost: loopback\r\n\r\n") {}

  // On the task's worker, inside its co_await: the I/O goes to the
  // loopback's thread.
  void start(crew::Resume<int> resume) {
    resume_.emplace(std::move(resume));
    boost::asio::post(socket_.get_executor(), [self = shared_from_this()] { self->connect(); });
  }

 private:
  void connect() {
    socket_.async_connect(to_, [self = shared_from_this()](boost::system::error_code ec) {
      if (ec) return self->finish(0);
      boost::asio::async_write(self->socket_, boost::asio::buffer(self->request_),
                               [self](boost::system::error_code wec, std::size_t) {
                                 if (wec) return self->finish(0);
                                 self->read();
                               });
    });
  }
  void read() {
    boost::asio::async_read_until(
        socket_, in_, "\r\n\r\n",
        [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
          if (ec) return self->finish(0);
          std::istream head(&self->in_);
          std::string version;
          int status = 0;
          head >> version >> status;
          self->finish(status);
        });
  }
  void finish(int status) {
    boost::system::error_code ignored;
    socket_.close(ignored);
    // Resumes the task on a worker of its pool.
    if (resume_) (*std::exchange(resume_, std::nullopt))(status);
  }

  tcp::socket socket_;
  tcp::endpoint to_;
  std::string request_;
  boost::asio::streambuf in_;
  std::optional<crew::Resume<int>> resume_;
};

// A slot of the in-flight bound, held by an event's task: given back when
// its frame is destroyed, whether the task ran or was refused unrun.
class Slot {
 public:
  Slot(std::counting_semaphore<>& slots, std::atomic<int>& in_flight) noexcept
      : slots_(&slots), in_flight_(&in_flight) {}
  Slot(Slot&& o) noexcept
      : slots_(std::exchange(o.slots_, nullptr)),
        in_flight_(std::exchange(o.in_flight_, nullptr)) {}
  Slot& operator=(Slot&&) = delete;
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
  ~Slot() {
    if (slots_ == nullptr) return;
    in_flight_->fetch_sub(1);
    slots_->release();
  }

 private:
  std::counting_semaphore<>* slots_;
  std::atomic<int>* in_flight_;
};

// The event's task: the call (no thread held while it waits), then its
// outcome line.
crew::Co<void> handle_event(std::uint64_t id, Loopback& loopback, OutcomeFile& file,
                            [[maybe_unused]] Slot slot) {  // held until the frame ends
  auto call = std::make_shared<Call>(loopback.io(), loopback.endpoint(), id);
  // Named first: g++ 12 may destroy the captures of a lambda made inside a
  // co_await expression twice (docs/coroutines.md, "Traps").
  auto start = [call](crew::Resume<int> resume) { call->start(std::move(resume)); };
  const int status = co_await crew::on_callback<int>(start);
  file.append(id, status == 200 ? "ok" : "failed");
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
  auto loopback = std::make_shared<Loopback>();
  const auto logger = std::make_shared<TimedLogger>();
  // Four workers and a queue of four for the tasks' starts and steps; the
  // bound on events in flight (64) is the semaphore's: the producer blocks
  // in the callback while it is reached.
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
  app.add_resource(loopback, {.name = "loopback"});
  app.add_pool(pool);

  constexpr int kInFlight = 64;
  std::counting_semaphore<> slots(kInFlight);
  std::atomic<int> in_flight{0};
  std::atomic<int> in_flight_max{0};
  std::atomic<std::uint64_t> accepted{0};
  const int code = app.run([&](const crew::Context& ctx) {
    std::printf("consuming; outcomes go to %s\n", out.c_str());
    std::fflush(stdout);
    {
      Producer producer([&](std::uint64_t id) {
        // Halting: take no new event. One that slips past this check is
        // still accepted by the pool, and the drain processes it.
        while (!slots.try_acquire_for(10ms)) {
          if (ctx.halting()) return false;
        }
        if (ctx.halting()) {
          slots.release();
          return false;
        }
        const int now = in_flight.fetch_add(1) + 1;
        int seen = in_flight_max.load();
        while (now > seen && !in_flight_max.compare_exchange_weak(seen, now)) {
        }
        const crew::Admission a = crew::spawn_detached(
            pool, handle_event(id, *loopback, *file, Slot(slots, in_flight)), {.name = "event"});
        if (a != crew::Admission::accepted) return false;  // its slot went with its frame
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

  std::printf("accepted %llu written %llu in_flight_max %d\n",
              static_cast<unsigned long long>(accepted.load()),
              static_cast<unsigned long long>(file->written()), in_flight_max.load());
  std::fflush(stdout);
  return code;
}
