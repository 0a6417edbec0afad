// The hook between a pool's exception report and the opt-in crew::stacktrace
// (crew/stacktrace.hpp): a pointer that stays null unless that target's
// object is linked into the program.
#include <atomic>

#include "crew/stacktrace.hpp"

namespace crew {
namespace {

std::atomic<detail::ThrowTraceReader> g_reader{nullptr};

}  // namespace

void detail::set_throw_trace_reader(ThrowTraceReader reader) noexcept {
  g_reader.store(reader, std::memory_order_release);
}

std::string throw_trace(const std::exception_ptr& e) {
  const detail::ThrowTraceReader reader = g_reader.load(std::memory_order_acquire);
  return reader != nullptr && e ? reader(e) : std::string();
}

}  // namespace crew
