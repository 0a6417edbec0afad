// Pool start-up when a thread cannot be created: a constructor that throws
// leaves no thread of its pool behind (one would hold the pool's state and
// idle forever), and one that returns gives a working pool.
//
// Thread creation is made to fail by interposing pthread_create, which is why
// this is a binary of its own: the interposer forwards every other call to
// the next definition (libc's, or a sanitizer's interceptor; under clang's
// ThreadSanitizer, a linker wrap: see below).
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <mutex>
#include <stop_token>
#include <string>
#include <system_error>
#include <vector>

#include "crew/log.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace {

// 0: off; n > 0: the n-th pthread_create from this thread on fails.
thread_local int t_fail_at = 0;
// Creations made to fail so far, on any thread.
std::atomic<int> g_failed{0};

// Whether this call of pthread_create is the one to fail (and counts it).
bool fail_this_creation() noexcept {
  if (t_fail_at <= 0 || --t_fail_at != 0) return false;
  g_failed.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

#if defined(CREW_TEST_WRAP_PTHREAD_CREATE)
// clang's ThreadSanitizer runtime is linked into the binary, and its
// pthread_create interceptor would be the one this definition replaces.
// The binary is linked with -Wl,--wrap=pthread_create instead
// (tests/CMakeLists.txt), which covers the calls from libcrew.a (the pool's
// threads, os_thread.hpp) but not from libstdc++.so (std::thread).
// NOLINTBEGIN(bugprone-reserved-identifier,readability-identifier-naming): the linker's names
extern "C" int __real_pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                                     void* (*start)(void*), void* arg);
extern "C" int __wrap_pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                                     void* (*start)(void*), void* arg) {
  if (fail_this_creation()) return EAGAIN;
  return __real_pthread_create(thread, attr, start, arg);
}
// NOLINTEND(bugprone-reserved-identifier,readability-identifier-naming)
#else
extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*start)(void*),
                              void* arg) {
  using Real = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const auto real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "pthread_create"));
  if (fail_this_creation()) return EAGAIN;
  return real(thread, attr, start, arg);
}
#endif

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Watchdog;

std::size_t thread_count() {
  std::size_t n = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

struct Quiet final : Logger {
  [[nodiscard]] LogLevel level() const noexcept override { return LogLevel::error; }
  void log(LogLevel, const LogContext&, std::string_view) noexcept override {}
};

// A pool starts its supervisor and min_workers threads: fail each creation in
// turn (and, last, none).
void fail_each_thread_creation(const PoolOptions& options) {
  const std::size_t before = thread_count();
  const int failed_before = g_failed.load();
  for (int k = 1; k <= 4; ++k) {
    SCOPED_TRACE("thread creation #" + std::to_string(k) + " fails");
    bool threw = false;
    t_fail_at = k;
    try {
      Pool pool(options);
      t_fail_at = 0;
      // A worker that could not start is started again on demand.
      EXPECT_EQ(pool.submit([] { return 7; }).get(), 7);
    } catch (const std::system_error&) {
      threw = true;
    }
    t_fail_at = 0;
    EXPECT_TRUE(eventually([&] { return thread_count() == before; }))
        << thread_count() << " threads left, " << before << " before"
        << (threw ? "; the constructor threw" : "");
  }
  EXPECT_GT(g_failed.load() - failed_before, 0)
      << "no thread creation was made to fail: the interposer is not in the path";
}

TEST(PoolStart, AConstructorThatCannotStartAThreadLeavesNoneBehind) {
  Watchdog dog;
  fail_each_thread_creation(
      {.name = "start", .min_workers = 2, .max_workers = 2, .logger = std::make_shared<Quiet>()});
}

TEST(PoolStart, WithARootStopTokenToo) {
  Watchdog dog;
  std::stop_source root;
  fail_each_thread_creation({.name = "start",
                             .min_workers = 1,
                             .max_workers = 2,
                             .stop_token = root.get_token(),
                             .logger = std::make_shared<Quiet>()});
}

// Remembers error lines; each one also reads the pool's stats, which take
// the pool's lock: a line logged under that lock would deadlock here.
struct StatsReadingLogger final : Logger {
  [[nodiscard]] LogLevel level() const noexcept override { return LogLevel::error; }
  void log(LogLevel, const LogContext&, std::string_view message) noexcept override {
    if (const Pool* p = pool.load()) (void)p->stats();
    const std::lock_guard lock(mu);
    lines.emplace_back(message);
  }
  std::vector<std::string> taken() {
    const std::lock_guard lock(mu);
    return lines;
  }
  std::atomic<const Pool*> pool{nullptr};
  std::mutex mu;
  std::vector<std::string> lines;
};

// The only worker a queued task would get cannot start (pthread_create
// fails once): the pool starts one later by itself, and says so in a log
// line written outside its locks.
TEST(PoolStart, AQueuedTaskGetsAWorkerWhenTheFirstThreadCannotStart) {
  Watchdog dog;
  auto logger = std::make_shared<StatsReadingLogger>();
  Pool pool({.name = "retry", .max_workers = 2, .logger = logger});
  logger->pool = &pool;
  const int failed_before = g_failed.load();
  t_fail_at = 1;
  auto task = pool.submit([] { return 7; });
  t_fail_at = 0;
  ASSERT_EQ(g_failed.load() - failed_before, 1) << "the submission started no thread";
  ASSERT_TRUE(task.wait_for(2s * test::kSlowdown)) << "the queued task got no worker";
  EXPECT_EQ(task.get(), 7);
  EXPECT_TRUE(eventually([&] { return !logger->taken().empty(); }));
  const auto lines = logger->taken();
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.front().find("cannot start a worker thread"), std::string::npos) << lines.front();
  logger->pool = nullptr;
}

}  // namespace
}  // namespace crew
