// The asymmetric fence of crew/detail/barrier.hpp, on membarrier(2).
#include "crew/detail/barrier.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

namespace crew::detail {
namespace {

long membarrier(int cmd) noexcept { return ::syscall(SYS_membarrier, cmd, 0U, 0); }

}  // namespace

void enable_light_fences() noexcept {
  static std::once_flag once;
  std::call_once(once, [] {
    const long supported = membarrier(MEMBARRIER_CMD_QUERY);
    if (supported < 0 || (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return;
    if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0) return;
    g_light_fences.store(true, std::memory_order_release);
  });
}

void heavy_fence() noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (g_light_fences.load(std::memory_order_acquire)) {
    // Registered, so it cannot fail with EPERM; EINTR is not returned by
    // this command. A failure would leave the light side unordered, which
    // the registration check rules out.
    (void)membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
  }
}

}  // namespace crew::detail
