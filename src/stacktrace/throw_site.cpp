// crew::stacktrace (crew/stacktrace.hpp): records the stack of every throw
// of the program that links it, and reads it back for a pool's exception
// report.
//
// The program is linked with -Wl,--wrap=__cxa_throw, so each `throw` in it
// calls __wrap___cxa_throw below, which records the raw frame addresses into
// the throwing thread's slot (no allocation, no lock, no symbol lookup) and
// goes on to the real __cxa_throw (under a sanitizer, its interceptor),
// with a destructor of its own that forgets the object when it is freed.
// The names and lines are resolved only when a report reads the slot, on
// the same thread, after the task has thrown.
//
// Who touches what: a thread's slot is written by that thread's throws and
// read by that thread's reports; the table of live exceptions is claimed by
// the throwing thread and released by whichever thread frees the exception.
#define BOOST_STACKTRACE_LINK
#include <atomic>
#include <boost/stacktrace.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <typeinfo>

#include "crew/stacktrace.hpp"

namespace {

using Frame = boost::stacktrace::frame::native_frame_ptr_t;

// The exception objects thrown through the wrapper and not yet freed, each
// with a number no other throw gets. An object freed and then reused by a
// throw the wrapper does not see (libstdc++'s own, make_exception_ptr's)
// is no longer in the table, so a thread's stale record never matches it.
// Any thread may free an exception; the table is a fixed array claimed and
// released with atomics. Full (more than kLive exceptions alive at once):
// the throw is not recorded.
constexpr std::size_t kLive = 256;

struct LiveException {
  std::atomic<const void*> object{nullptr};
  std::atomic<std::uint64_t> number{0};
  std::atomic<void (*)(void*)> destroy{nullptr};  // the one __cxa_throw was given
};

LiveException g_live[kLive];
std::atomic<std::uint64_t> g_next_number{1};

std::size_t home_of(const void* object) noexcept {
  return (reinterpret_cast<std::uintptr_t>(object) >> 4) % kLive;
}

LiveException* find_live(const void* object) noexcept {
  for (std::size_t i = 0, at = home_of(object); i < kLive; ++i, at = (at + 1) % kLive) {
    if (g_live[at].object.load(std::memory_order_acquire) == object) return &g_live[at];
  }
  return nullptr;
}

// Runs instead of the exception's destructor when its last reference goes,
// on whichever thread that is: releases its entry, then destroys it.
void destroy_live(void* object) {
  LiveException* live = find_live(object);
  void (*destroy)(void*) = live->destroy.load(std::memory_order_acquire);
  live->number.store(0, std::memory_order_relaxed);
  live->object.store(nullptr, std::memory_order_release);
  if (destroy != nullptr) destroy(object);
}

struct ThrowSite {
  const void* object = nullptr;  // the exception object of the last throw
  std::uint64_t number = 0;      // its LiveException::number
  std::size_t frames = 0;
  Frame stack[64];
};

thread_local ThrowSite t_last;

// The object an exception_ptr refers to: libstdc++'s (and libc++'s)
// exception_ptr is one pointer, to the object __cxa_throw was given.
const void* object_of(const std::exception_ptr& e) noexcept {
  static_assert(sizeof(std::exception_ptr) == sizeof(void*));
  const void* object = nullptr;
  std::memcpy(&object, &e, sizeof object);
  return object;
}

std::string read_throw_site(const std::exception_ptr& e) {
  const ThrowSite& site = t_last;
  const void* object = object_of(e);
  if (site.frames == 0 || site.object != object) return {};
  const LiveException* live = find_live(object);
  if (live == nullptr || live->number.load(std::memory_order_acquire) != site.number) return {};
  // The frames are return addresses: one byte back is inside the call, so
  // that a call that never returns (the throw itself, the function's last
  // instruction) is not looked up as the start of the next function. As
  // integers: a null frame stays null (pointer arithmetic on it is UB).
  Frame calls[sizeof site.stack / sizeof(Frame)] = {};
  for (std::size_t i = 0; i < site.frames; ++i) {
    const auto address = reinterpret_cast<std::uintptr_t>(site.stack[i]);
    calls[i] = reinterpret_cast<Frame>(address == 0 ? address : address - 1);
  }
  return boost::stacktrace::to_string(
      boost::stacktrace::stacktrace::from_dump(calls, site.frames * sizeof(Frame)));
}

// Installs the reader before main, so no report can miss it.
[[maybe_unused]] const bool g_installed = [] {
  crew::detail::set_throw_trace_reader(&read_throw_site);
  return true;
}();

}  // namespace

extern "C" {

[[noreturn]] void __real___cxa_throw(void* object, std::type_info* type, void (*destroy)(void*));

[[noreturn]] void __wrap___cxa_throw(void* object, std::type_info* type, void (*destroy)(void*)) {
  ThrowSite& site = t_last;
  site.object = nullptr;  // a partial record never matches
  for (std::size_t i = 0, at = home_of(object); i < kLive; ++i, at = (at + 1) % kLive) {
    const void* expected = nullptr;
    LiveException& live = g_live[at];
    if (!live.object.compare_exchange_strong(expected, object, std::memory_order_acq_rel)) continue;
    const std::uint64_t number = g_next_number.fetch_add(1, std::memory_order_relaxed);
    live.destroy.store(destroy, std::memory_order_release);
    live.number.store(number, std::memory_order_release);
    // Skips this function's own frame: the throwing function comes first.
    site.frames = boost::stacktrace::safe_dump_to(1, site.stack, sizeof site.stack);
    site.number = number;
    site.object = object;
    __real___cxa_throw(object, type, &destroy_live);
  }
  __real___cxa_throw(object, type, destroy);
}

}  // extern "C"
