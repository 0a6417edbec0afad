#include "loadgen.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string_view>

#include "http_text.hpp"

namespace loadgen {
namespace {

constexpr std::int64_t kSecond = 1'000'000'000;
// How often timeouts are checked and per-second lines printed.
constexpr std::int64_t kTick = 10'000'000;

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * kSecond + ts.tv_nsec;
}

[[noreturn]] void fail(const char* what) {
  throw std::runtime_error(std::string(what) + ": " + std::strerror(errno));
}

enum class Error : std::uint8_t { none, connect, closed, timeout, bad_response };

const char* to_string(Error e) {
  switch (e) {
    case Error::connect:
      return "connect";
    case Error::closed:
      return "closed";
    case Error::timeout:
      return "timeout";
    case Error::bad_response:
      return "bad_response";
    case Error::none:
      break;
  }
  return "none";
}

// One scheduled request and its outcome.
struct Record {
  std::int64_t sched_ns = 0;
  std::int64_t sent_ns = -1;
  std::int64_t done_ns = -1;  // answered or failed
  int status = 0;             // 0: no answer
  std::uint32_t body = 0;
  std::uint16_t reason = 0;  // index into Generator::reason_names_
  Error error = Error::none;
};

struct Conn {
  int fd = -1;
  bool connected = false;
  bool want_out = false;  // EPOLLOUT registered
  std::int64_t req = -1;  // the request in flight, or -1
  std::size_t out_off = 0;
  std::string in;
};

class Generator {
 public:
  explicit Generator(const Options& o) : o_(o) {}
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;
  ~Generator() {
    for (auto& c : conns_) {
      if (c && c->fd >= 0) ::close(c->fd);
    }
    if (timer_ >= 0) ::close(timer_);
    if (ep_ >= 0) ::close(ep_);
    if (addr_ != nullptr) ::freeaddrinfo(addr_);
  }

  Result run();

 private:
  void setup();
  void build_requests();
  int open_conn(std::int64_t req);
  void close_conn(int slot);
  void dispatch(std::int64_t req);
  void start(int slot, std::int64_t req);
  void write_some(int slot);
  void read_some(int slot);
  void finish(int slot, Error error, int status, std::string_view reason);
  void give_back(int slot);
  void set_out(int slot, bool on);
  void housekeeping(std::int64_t now);
  void flush_seconds(std::int64_t upto_ns);
  Second& second_at(std::int64_t t_ns);
  std::uint16_t intern_reason(int status, std::string_view reason);
  Result summarize();

  const Options& o_;
  addrinfo* addr_ = nullptr;
  std::vector<std::string> requests_;  // the bytes of each body's request
  std::vector<Record> rec_;
  std::vector<std::unique_ptr<Conn>> conns_;  // by slot; null: free slot
  std::vector<int> free_slots_;
  std::vector<int> idle_;             // connected and free, most recently used last
  std::deque<std::int64_t> waiting_;  // scheduled, no connection yet
  unsigned open_ = 0, opened_ = 0, max_open_ = 0;
  std::size_t outstanding_ = 0;  // scheduled and not finished
  std::int64_t start_ = 0;
  int ep_ = -1, timer_ = -1;
  std::vector<std::string> reason_names_{""};
  std::vector<Second> seconds_;
  std::vector<std::vector<std::int64_t>> second_lat_;
  std::size_t printed_ = 0;
};

void Generator::setup() {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = ::getaddrinfo(o_.target.host.c_str(), o_.target.port.c_str(), &hints, &addr_);
      rc != 0) {
    throw std::runtime_error("cannot resolve " + o_.target.host + ":" + o_.target.port + ": " +
                             gai_strerror(rc));
  }
  // Send times are kept to the microsecond: no timer slack for this thread.
  (void)::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &lim);
  }
  ep_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep_ < 0) fail("epoll_create1");
  timer_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer_ < 0) fail("timerfd_create");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = ~0ULL;
  if (::epoll_ctl(ep_, EPOLL_CTL_ADD, timer_, &ev) != 0) fail("epoll_ctl timerfd");
}

void Generator::build_requests() {
  const std::size_t n = std::max<std::size_t>(o_.bodies.size(), 1);
  for (std::size_t i = 0; i < n; ++i) {
    std::string r = o_.method + " " + o_.target.path + " HTTP/1.1\r\nHost: " + o_.target.host +
                    ":" + o_.target.port + "\r\n";
    for (const std::string& h : o_.headers) r += h + "\r\n";
    if (i < o_.bodies.size()) {
      r += "Content-Length: " + std::to_string(o_.bodies[i].size()) + "\r\n\r\n" + o_.bodies[i];
    } else {
      r += "\r\n";
    }
    requests_.push_back(std::move(r));
  }
}

int Generator::open_conn(std::int64_t req) {
  const int fd = ::socket(addr_->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) fail("socket");
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int slot = 0;
  if (free_slots_.empty()) {
    slot = static_cast<int>(conns_.size());
    conns_.emplace_back();
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  conns_[static_cast<std::size_t>(slot)] = std::make_unique<Conn>();
  Conn& c = *conns_[static_cast<std::size_t>(slot)];
  c.fd = fd;
  c.req = req;
  ++open_;
  ++opened_;
  max_open_ = std::max(max_open_, open_);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
  ev.data.u64 = static_cast<std::uint64_t>(slot);
  c.want_out = true;
  if (::epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev) != 0) fail("epoll_ctl add");
  if (::connect(fd, addr_->ai_addr, addr_->ai_addrlen) != 0 && errno != EINPROGRESS) {
    if (req >= 0) {
      finish(slot, Error::connect, 0, {});
    } else {
      close_conn(slot);
    }
    return -1;
  }
  return slot;
}

void Generator::close_conn(int slot) {
  auto& c = conns_[static_cast<std::size_t>(slot)];
  if (!c) return;
  ::close(c->fd);  // also removes it from the epoll set
  c.reset();
  free_slots_.push_back(slot);
  --open_;
  if (const auto it = std::find(idle_.begin(), idle_.end(), slot); it != idle_.end()) {
    idle_.erase(it);
  }
}

void Generator::set_out(int slot, bool on) {
  Conn& c = *conns_[static_cast<std::size_t>(slot)];
  if (c.want_out == on) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0U);
  ev.data.u64 = static_cast<std::uint64_t>(slot);
  if (::epoll_ctl(ep_, EPOLL_CTL_MOD, c.fd, &ev) != 0) fail("epoll_ctl mod");
  c.want_out = on;
}

void Generator::dispatch(std::int64_t req) {
  if (!idle_.empty()) {
    const int slot = idle_.back();
    idle_.pop_back();
    start(slot, req);
  } else if (open_ < o_.max_connections) {
    (void)open_conn(req);  // sends once connected
  } else {
    waiting_.push_back(req);
  }
}

void Generator::start(int slot, std::int64_t req) {
  Conn& c = *conns_[static_cast<std::size_t>(slot)];
  c.req = req;
  c.out_off = 0;
  c.in.clear();
  Record& r = rec_[static_cast<std::size_t>(req)];
  r.sent_ns = now_ns();
  ++second_at(r.sent_ns).sent;
  if (r.sent_ns - r.sched_ns > o_.late_ns) ++second_at(r.sent_ns).late;
  write_some(slot);
}

void Generator::write_some(int slot) {
  Conn& c = *conns_[static_cast<std::size_t>(slot)];
  const std::string& bytes = requests_[rec_[static_cast<std::size_t>(c.req)].body];
  while (c.out_off < bytes.size()) {
    const ssize_t n =
        ::send(c.fd, bytes.data() + c.out_off, bytes.size() - c.out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_off += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EAGAIN) {
      set_out(slot, true);
      return;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      finish(slot, Error::closed, 0, {});
      return;
    }
  }
  set_out(slot, false);
}

void Generator::read_some(int slot) {
  char buf[16384];
  for (;;) {
    Conn& c = *conns_[static_cast<std::size_t>(slot)];
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) {
      if (c.req < 0) {  // an idle connection is not sent anything
        close_conn(slot);
        return;
      }
      c.in.append(buf, static_cast<std::size_t>(n));
      const Head h = parse_head(c.in);
      if (h.bad) {
        finish(slot, Error::bad_response, 0, {});
        return;
      }
      if (!h.complete) continue;
      if (c.in.size() > h.length) {  // bytes beyond the one response asked for
        finish(slot, Error::bad_response, 0, {});
        return;
      }
      std::string_view reason;
      if (h.status < 200 || h.status >= 300) {
        reason = body_reason(std::string_view(c.in).substr(h.body_at));
      }
      const std::string reason_copy(reason);
      finish(slot, Error::none, h.status, reason_copy);
      if (!conns_[static_cast<std::size_t>(slot)]) return;
      if (h.close) {
        close_conn(slot);
        if (!waiting_.empty() && open_ < o_.max_connections) {
          const std::int64_t next = waiting_.front();
          waiting_.pop_front();
          (void)open_conn(next);
        }
      } else {
        give_back(slot);
      }
      return;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    // Closed or reset.
    if (c.req >= 0) {
      finish(slot, Error::closed, 0, {});
    } else {
      close_conn(slot);
    }
    return;
  }
}

// Records the outcome of the slot's request; on an error the connection is
// closed (and replaced for a waiting request).
void Generator::finish(int slot, Error error, int status, std::string_view reason) {
  Conn& c = *conns_[static_cast<std::size_t>(slot)];
  Record& r = rec_[static_cast<std::size_t>(c.req)];
  c.req = -1;
  r.done_ns = now_ns();
  r.error = error;
  r.status = status;
  --outstanding_;
  Second& s = second_at(r.done_ns);
  if (error != Error::none) {
    ++s.errors;
    close_conn(slot);
    if (!waiting_.empty() && open_ < o_.max_connections) {
      const std::int64_t next = waiting_.front();
      waiting_.pop_front();
      (void)open_conn(next);
    }
    return;
  }
  r.reason = status >= 200 && status < 300 ? 0 : intern_reason(status, reason);
  const std::int64_t latency = r.done_ns - r.sched_ns;
  ++s.answered;
  if (status >= 200 && status < 300) {
    ++s.ok;
    if (latency <= o_.slo_ns) ++s.goodput;
  } else {
    ++s.rejected;
  }
  second_lat_[static_cast<std::size_t>(&s - seconds_.data())].push_back(latency);
}

void Generator::give_back(int slot) {
  if (!waiting_.empty()) {
    const std::int64_t next = waiting_.front();
    waiting_.pop_front();
    start(slot, next);
  } else {
    idle_.push_back(slot);
  }
}

std::uint16_t Generator::intern_reason(int status, std::string_view reason) {
  std::string name = std::to_string(status);
  if (!reason.empty()) name += " " + std::string(reason);
  const auto it = std::find(reason_names_.begin(), reason_names_.end(), name);
  if (it != reason_names_.end()) return static_cast<std::uint16_t>(it - reason_names_.begin());
  reason_names_.push_back(std::move(name));
  return static_cast<std::uint16_t>(reason_names_.size() - 1);
}

Second& Generator::second_at(std::int64_t t_ns) {
  const auto i = static_cast<std::size_t>(std::max<std::int64_t>(t_ns - start_, 0) / kSecond);
  if (i >= seconds_.size()) {
    seconds_.resize(i + 1);
    second_lat_.resize(i + 1);
  }
  return seconds_[i];
}

// Gives up on requests past their timeout (sent or still waiting).
void Generator::housekeeping(std::int64_t now) {
  for (std::size_t slot = 0; slot < conns_.size(); ++slot) {
    const auto& c = conns_[slot];
    if (c && c->req >= 0 && now - rec_[static_cast<std::size_t>(c->req)].sched_ns > o_.timeout_ns) {
      finish(static_cast<int>(slot), Error::timeout, 0, {});
    }
  }
  while (!waiting_.empty() &&
         now - rec_[static_cast<std::size_t>(waiting_.front())].sched_ns > o_.timeout_ns) {
    Record& r = rec_[static_cast<std::size_t>(waiting_.front())];
    waiting_.pop_front();
    r.done_ns = now;
    r.error = Error::timeout;
    --outstanding_;
    ++second_at(now).errors;
  }
}

// Prints the seconds that ended before upto_ns.
void Generator::flush_seconds(std::int64_t upto_ns) {
  while (start_ + static_cast<std::int64_t>(printed_ + 1) * kSecond <= upto_ns) {
    Second& s = second_at(start_ + static_cast<std::int64_t>(printed_) * kSecond);
    s.connections = open_;
    s.latency = percentiles(second_lat_[printed_]);
    if (o_.on_second) o_.on_second(per_second_line(printed_, s));
    ++printed_;
  }
}

Result Generator::run() {
  setup();
  build_requests();
  const std::vector<Send> sends = poisson_schedule(o_.phases, o_.seed);
  const double length = total_seconds(o_.phases);
  rec_.resize(sends.size());
  for (std::size_t i = 0; i < sends.size(); ++i) {
    if (sends[i].body >= requests_.size()) {
      throw std::runtime_error("a phase names body " + std::to_string(sends[i].body) +
                               " but only " + std::to_string(requests_.size()) + " are given");
    }
    rec_[i].body = sends[i].body;
  }
  outstanding_ = sends.size();
  seconds_.resize(static_cast<std::size_t>(std::ceil(length)));
  second_lat_.resize(seconds_.size());

  // Warm connections before the clock starts: connect time is not the server's answer.
  for (unsigned i = 0; i < std::min(o_.connections, o_.max_connections); ++i) {
    (void)open_conn(-1);
  }
  std::vector<epoll_event> events(1024);
  const std::int64_t warm_until = now_ns() + kSecond;
  while (idle_.size() < open_ && now_ns() < warm_until) {
    const int n = ::epoll_wait(ep_, events.data(), static_cast<int>(events.size()), 10);
    for (int i = 0; i < n; ++i) {
      const auto slot = static_cast<int>(events[static_cast<std::size_t>(i)].data.u64);
      auto& c = conns_[static_cast<std::size_t>(slot)];
      if (!c) continue;
      int err = 0;
      socklen_t len = sizeof err;
      (void)::getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0 || (events[static_cast<std::size_t>(i)].events & (EPOLLHUP | EPOLLERR))) {
        close_conn(slot);
      } else if (!c->connected) {
        c->connected = true;
        set_out(slot, false);
        idle_.push_back(slot);
      }
    }
  }

  start_ = now_ns();
  for (std::size_t i = 0; i < sends.size(); ++i) rec_[i].sched_ns = start_ + sends[i].at_ns;
  for (const Record& r : rec_) ++second_at(r.sched_ns).scheduled;

  std::size_t next = 0;
  std::int64_t next_tick = start_ + kTick;
  std::int64_t armed = -1;
  while (outstanding_ > 0) {
    std::int64_t now = now_ns();
    while (next < rec_.size() && rec_[next].sched_ns <= now) {
      dispatch(static_cast<std::int64_t>(next++));
    }
    if (now >= next_tick) {
      housekeeping(now);
      flush_seconds(now);
      next_tick = now + kTick;
    }
    if (outstanding_ == 0) break;
    const std::int64_t wake =
        next < rec_.size() ? std::min(rec_[next].sched_ns, next_tick) : next_tick;
    if (wake != armed) {
      itimerspec spec{};
      spec.it_value.tv_sec = static_cast<time_t>(wake / kSecond);
      spec.it_value.tv_nsec = static_cast<long>(wake % kSecond);
      if (::timerfd_settime(timer_, TFD_TIMER_ABSTIME, &spec, nullptr) != 0) {
        fail("timerfd_settime");
      }
      armed = wake;
    }
    const int n = ::epoll_wait(ep_, events.data(), static_cast<int>(events.size()), -1);
    if (n < 0 && errno != EINTR) fail("epoll_wait");
    for (int i = 0; i < n; ++i) {
      const epoll_event& ev = events[static_cast<std::size_t>(i)];
      if (ev.data.u64 == ~0ULL) {
        std::uint64_t expirations = 0;
        (void)!::read(timer_, &expirations, sizeof expirations);
        armed = -1;
        continue;
      }
      const auto slot = static_cast<int>(ev.data.u64);
      if (!conns_[static_cast<std::size_t>(slot)]) continue;
      Conn& c = *conns_[static_cast<std::size_t>(slot)];
      if (!c.connected && (ev.events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        int err = 0;
        socklen_t len = sizeof err;
        (void)::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0 || (ev.events & EPOLLERR)) {
          if (c.req >= 0) {
            finish(slot, Error::connect, 0, {});
          } else {
            close_conn(slot);
          }
          continue;
        }
        c.connected = true;
        if (c.req >= 0) {
          start(slot, c.req);
        } else {
          set_out(slot, false);
          give_back(slot);
        }
        continue;
      }
      if ((ev.events & EPOLLOUT) && c.req >= 0) write_some(slot);
      if (!conns_[static_cast<std::size_t>(slot)]) continue;
      if (ev.events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) read_some(slot);
    }
  }
  flush_seconds(std::max(now_ns(), start_ + static_cast<std::int64_t>(seconds_.size()) * kSecond));
  return summarize();
}

Result Generator::summarize() {
  Result res;
  res.seconds = total_seconds(o_.phases);
  res.scheduled = rec_.size();
  res.target_rate = res.seconds > 0 ? static_cast<double>(rec_.size()) / res.seconds : 0;
  std::vector<std::int64_t> lag, lat, lat_ok, service, rejection, sent_at;
  std::vector<std::vector<std::int64_t>> by_reason(reason_names_.size());
  for (const Record& r : rec_) {
    if (r.sent_ns >= 0) {
      ++res.sent;
      lag.push_back(r.sent_ns - r.sched_ns);
      if (r.sent_ns - r.sched_ns > o_.late_ns) ++res.late;
      sent_at.push_back(r.sent_ns);
    }
    if (r.error != Error::none) {
      ++res.errors[to_string(r.error)];
      continue;
    }
    if (r.status == 0) continue;
    ++res.answered;
    ++res.status[r.status];
    const std::int64_t l = r.done_ns - r.sched_ns;
    lat.push_back(l);
    service.push_back(r.done_ns - r.sent_ns);
    if (r.status >= 200 && r.status < 300) {
      lat_ok.push_back(l);
      if (l <= o_.slo_ns) ++res.goodput;
    } else {
      rejection.push_back(l);
      by_reason[r.reason].push_back(l);
      ++res.reasons[reason_names_[r.reason]];
    }
  }
  std::sort(sent_at.begin(), sent_at.end());
  if (sent_at.size() >= 2) {
    const double span_ns = static_cast<double>(sent_at.back() - sent_at.front());
    res.achieved_rate = static_cast<double>(sent_at.size() - 1) / span_ns * 1e9;
    res.interarrival_mean_ms = span_ns / static_cast<double>(sent_at.size() - 1) / 1e6;
  }
  res.send_lag = percentiles(lag);
  res.latency = percentiles(lat);
  res.latency_ok = percentiles(lat_ok);
  res.service = percentiles(service);
  res.rejection = percentiles(rejection);
  for (std::size_t i = 1; i < by_reason.size(); ++i) {
    res.rejection_by_reason[reason_names_[i]] = percentiles(by_reason[i]);
  }
  res.connections_opened = opened_;
  res.max_open = max_open_;
  res.per_second = seconds_;
  return res;
}

}  // namespace

Result run(const Options& options) { return Generator(options).run(); }

}  // namespace loadgen
