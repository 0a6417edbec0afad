// Whether the machine's CPUs are contended (cpu_pressure.hpp).
#include "cpu_pressure.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <type_traits>

#include "crew/detail/spin_lock.hpp"
#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

bool CpuContention::update(std::int64_t now_ns, std::int64_t total_us) noexcept {
  if (!primed_ || total_us < last_us_ || now_ns <= last_ns_) {
    primed_ = true;
    last_ns_ = now_ns;
    last_us_ = total_us;
    return contended_;
  }
  const std::int64_t elapsed = now_ns - last_ns_;
  const double share = std::clamp(
      static_cast<double>(total_us - last_us_) * 1000.0 / static_cast<double>(elapsed), 0.0, 1.0);
  if (fresh_ || elapsed > kRestartNs) {
    share_ = share;
  } else {
    share_ += (share > share_ ? kRiseWeight : kFallWeight) * (share - share_);
  }
  fresh_ = false;
  contended_ = contended_ ? share_ >= kOffShare : share_ >= kOnShare;
  last_ns_ = now_ns;
  last_us_ = total_us;
  return contended_;
}

std::int64_t parse_pressure_total(std::string_view text) noexcept {
  while (!text.empty()) {
    const std::size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    if (!line.starts_with("some ")) continue;
    static constexpr std::string_view kKey = " total=";
    const std::size_t at = line.find(kKey);
    if (at == std::string_view::npos) return -1;
    const char* first = line.data() + at + kKey.size();
    const char* last = line.data() + line.size();
    std::int64_t total = -1;
    const auto [ptr, ec] = std::from_chars(first, last, total);
    if (ec != std::errc{} || ptr == first || (ptr != last && *ptr != ' ') || total < 0) return -1;
    return total;
  }
  return -1;
}

namespace {

constexpr int kUnopened = -2;
constexpr int kUnavailable = -1;

struct Gauge {
  // Until when the last answer stands (INT64_MAX: no source, never read).
  std::atomic<std::int64_t> due_ns{0};
  std::atomic<bool> contended{false};
  std::atomic<PressureSource> source{nullptr};
  // Held by the one caller that reads (taken with try_lock: the others do
  // not wait for it).
  SpinLock reading;
  CpuContention filter CREW_GUARDED_BY(reading);
  int fd CREW_GUARDED_BY(reading) = kUnopened;
};

// Trivially destructible, so that a worker still running while the process
// exits may use it. Its descriptor stays open for the process's life.
static_assert(std::is_trivially_destructible_v<Gauge>);
constinit Gauge g_gauge;

// fork() copies the gauge's lock as it is: held by another thread at that
// moment, it would stay held in the child, whose reading would never change
// again. The forking thread takes it first (a reader holds it for one read
// of /proc/pressure/cpu), and parent and child release it after.
void lock_gauge() noexcept CREW_NO_THREAD_SAFETY_ANALYSIS { g_gauge.reading.lock(); }
void unlock_gauge() noexcept CREW_NO_THREAD_SAFETY_ANALYSIS { g_gauge.reading.unlock(); }
[[maybe_unused]] const int g_gauge_fork_handlers =
    pthread_atfork(lock_gauge, unlock_gauge, unlock_gauge);

// The cumulative "some" total of /proc/pressure/cpu, or -1 (and the file is
// not tried again) if it cannot be read.
std::int64_t read_pressure_file(Gauge& g) noexcept CREW_REQUIRES(g.reading) {
  if (g.fd == kUnopened) {
    g.fd = ::open("/proc/pressure/cpu", O_RDONLY | O_CLOEXEC);
    if (g.fd < 0) g.fd = kUnavailable;
  }
  if (g.fd == kUnavailable) return -1;
  char buf[256];
  ssize_t n = 0;
  do {
    n = ::pread(g.fd, buf, sizeof buf, 0);
  } while (n < 0 && errno == EINTR);  // a signal is no reason to give up
  // A kernel built with the interface but booted without it (psi=0) fails
  // the read with EOPNOTSUPP.
  const std::int64_t total =
      n > 0 ? parse_pressure_total({buf, static_cast<std::size_t>(n)}) : std::int64_t{-1};
  if (total < 0) {
    ::close(g.fd);
    g.fd = kUnavailable;
  }
  return total;
}

}  // namespace

bool cpus_contended(std::int64_t now_ns) noexcept {
  Gauge& g = g_gauge;
  if (now_ns < g.due_ns.load(std::memory_order_relaxed) || !g.reading.try_lock()) {
    return g.contended.load(std::memory_order_relaxed);
  }
  bool contended = g.contended.load(std::memory_order_relaxed);
  if (now_ns >= g.due_ns.load(std::memory_order_relaxed)) {  // not read meanwhile
    const PressureSource source = g.source.load(std::memory_order_relaxed);
    const std::int64_t total = source != nullptr ? source() : read_pressure_file(g);
    contended = total >= 0 && g.filter.update(now_ns, total);
    g.contended.store(contended, std::memory_order_relaxed);
    const bool gone = source == nullptr && g.fd == kUnavailable;
    g.due_ns.store(gone ? INT64_MAX : now_ns + CpuContention::kPeriodNs, std::memory_order_relaxed);
  }
  g.reading.unlock();
  return contended;
}

void set_pressure_source_for_testing(PressureSource source) noexcept {
  Gauge& g = g_gauge;
  const SpinLockGuard lock(g.reading);
  g.source.store(source, std::memory_order_relaxed);
  g.filter = CpuContention{};
  if (g.fd == kUnavailable) g.fd = kUnopened;
  g.contended.store(false, std::memory_order_relaxed);
  g.due_ns.store(0, std::memory_order_relaxed);
}

}  // namespace crew::detail
