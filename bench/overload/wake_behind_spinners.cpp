// wake_behind_spinners: how late a thread woken by a timer gets its CPU when
// CPU-bound threads share that CPU. It stands for crewd's I/O thread on one
// CPU with busy jobs workers (W3 in docs/bench/overload.md): the I/O thread
// arms a short timer (crewd's answer backoff, a request's deadline) or waits
// for a socket, sleeps, and is woken while the workers compute.
//
//   wake_behind_spinners [--spinners N] [--policy normal|batch|idle]
//                        [--nice N] [--wakes N] [--after-us N] [--busy-us N]
//                        [--pause-us N] [--cpu N]
//
// All threads run on --cpu (default: the first CPU of the affinity mask).
// The spinners compute without end under --policy and --nice; the waiter,
// at the process's own scheduling, repeats: arm a timerfd --after-us ahead,
// sleep in epoll_wait, note how late it runs after the timer's expiry,
// compute --busy-us (its handling), sleep --pause-us. Prints the lateness's
// percentiles and how many wake-ups ran more than 0.5 ms late.
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace {

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void spin_for_ns(std::int64_t ns) {
  const std::int64_t until = now_ns() + ns;
  while (now_ns() < until) {
  }
}

struct Options {
  int spinners = 2;
  std::string policy = "normal";
  int nice = 3;
  int wakes = 3000;
  int after_us = 20;
  int busy_us = 15;
  int pause_us = 1;
  int cpu = -1;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "wake_behind_spinners: %s\nusage: wake_behind_spinners [--spinners N] "
               "[--policy normal|batch|idle] [--nice N] [--wakes N] [--after-us N] "
               "[--busy-us N] [--pause-us N] [--cpu N]\n",
               why);
  std::exit(2);
}

int int_arg(int argc, char** argv, int& i) {
  if (i + 1 >= argc) usage("a value is missing");
  char* end = nullptr;
  const long v = std::strtol(argv[++i], &end, 10);
  if (*end != '\0' || v < 0 || v > 1'000'000'000) usage("not a count");
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--spinners") {
      o.spinners = int_arg(argc, argv, i);
    } else if (a == "--policy") {
      if (i + 1 >= argc) usage("--policy needs a value");
      o.policy = argv[++i];
      if (o.policy != "normal" && o.policy != "batch" && o.policy != "idle") usage("bad --policy");
    } else if (a == "--nice") {
      o.nice = int_arg(argc, argv, i);
    } else if (a == "--wakes") {
      o.wakes = std::max(1, int_arg(argc, argv, i));
    } else if (a == "--after-us") {
      o.after_us = int_arg(argc, argv, i);
    } else if (a == "--busy-us") {
      o.busy_us = int_arg(argc, argv, i);
    } else if (a == "--pause-us") {
      o.pause_us = int_arg(argc, argv, i);
    } else if (a == "--cpu") {
      o.cpu = int_arg(argc, argv, i);
    } else {
      usage(("unknown argument " + a).c_str());
    }
  }
  return o;
}

int first_cpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  for (std::size_t c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) return static_cast<int>(c);
  }
  return 0;
}

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<std::size_t>(cpu), &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
    std::fprintf(stderr, "wake_behind_spinners: cannot pin to CPU %d\n", cpu);
    std::exit(1);
  }
}

void schedule_spinner(const Options& o) {
  if (o.policy != "normal") {
    const sched_param p{};
    const int policy = o.policy == "idle" ? SCHED_IDLE : SCHED_BATCH;
    if (pthread_setschedparam(pthread_self(), policy, &p) != 0) {
      std::fprintf(stderr, "wake_behind_spinners: policy %s refused\n", o.policy.c_str());
      std::exit(1);
    }
  }
  if (o.policy != "idle" &&
      setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), o.nice) != 0) {
    std::fprintf(stderr, "wake_behind_spinners: nice %d refused: %s\n", o.nice,
                 std::strerror(errno));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const int cpu = o.cpu >= 0 ? o.cpu : first_cpu();
  const int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  if (tfd < 0 || ep < 0) {
    std::perror("wake_behind_spinners");
    return 1;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev) != 0) {
    std::perror("wake_behind_spinners: epoll_ctl");
    return 1;
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> spinners;
  for (int i = 0; i < o.spinners; ++i) {
    spinners.emplace_back([&] {
      pin(cpu);
      schedule_spinner(o);
      while (!stop.load(std::memory_order_relaxed)) spin_for_ns(100'000);
    });
  }
  std::vector<std::int64_t> late;
  late.reserve(static_cast<std::size_t>(o.wakes));
  std::thread waiter([&] {
    pin(cpu);
    for (int k = 0; k < o.wakes; ++k) {
      const std::int64_t due = now_ns() + std::int64_t{o.after_us} * 1000;
      itimerspec its{};
      its.it_value.tv_sec = due / 1'000'000'000;
      its.it_value.tv_nsec = due % 1'000'000'000;
      timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, nullptr);
      epoll_event e{};
      const int n = epoll_wait(ep, &e, 1, 1000);
      const std::int64_t woke = now_ns();
      std::uint64_t expirations = 0;
      (void)!read(tfd, &expirations, sizeof expirations);
      if (n == 1) late.push_back(woke - due);
      spin_for_ns(std::int64_t{o.busy_us} * 1000);
      if (o.pause_us > 0) usleep(static_cast<useconds_t>(o.pause_us));
    }
  });
  waiter.join();
  stop.store(true);
  for (auto& t : spinners) t.join();
  if (late.empty()) {
    std::fprintf(stderr, "wake_behind_spinners: no wake-up measured\n");
    return 1;
  }
  std::sort(late.begin(), late.end());
  const auto at = [&](double q) {
    return static_cast<double>(
               late[static_cast<std::size_t>(q * static_cast<double>(late.size() - 1))]) /
           1000.0;
  };
  const auto over =
      std::count_if(late.begin(), late.end(), [](std::int64_t x) { return x > 500'000; });
  std::printf(
      "spinners %d (%s, nice %d) on CPU %d: %zu timer wake-ups, late by p50 %.1f us, p99 %.1f us, "
      "p99.9 %.1f us, max %.1f us; %lld more than 0.5 ms late\n",
      o.spinners, o.policy.c_str(), o.policy == "idle" ? 0 : o.nice, cpu, late.size(), at(0.5),
      at(0.99), at(0.999), at(1.0), static_cast<long long>(over));
  return 0;
}
