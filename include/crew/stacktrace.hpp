// crew/stacktrace.hpp: where a task's exception was thrown, for programs
// that opt in.
//
// A program opts in by linking the target crew::stacktrace (CMake option
// CREW_STACKTRACE, on when Boost.Stacktrace is found; Debian:
// libboost-stacktrace-dev). That target links the program with
// -Wl,--wrap=__cxa_throw: every `throw` compiled into the program (its own
// objects and the static libraries linked into it, crew's included) first
// records the raw frame addresses of the throwing stack, without allocating,
// into a slot of the throwing thread, then throws as usual. A pool's report
// of an unhandled task exception (the log line with the task's name, when
// there is no on_exception handler) then ends with that stack, one frame a
// line, the throwing function first. A program that does not link the
// target pays nothing: no wrapper, and the report only reads a null
// pointer.
//
// Limits: only the last throw of each thread is kept, so the trace is shown
// only when the reported exception is that very object (a task that caught
// one exception and threw another shows the second's stack; one rethrown
// with std::rethrow_exception on another thread shows none). Throws inside
// shared libraries (libstdc++'s own std::__throw_* among them) are not
// wrapped, nor are throws while 256 wrapped exceptions are alive at once.
// Frame names and lines need the program's debug info (-g).
// docs/api.md, "Stack traces of task exceptions", has an example.
#pragma once

#include <exception>
#include <string>

namespace crew {

// The stack at the throw of `e`, one frame a line (" 0# f() at x.cpp:12"),
// when the program links crew::stacktrace and `e` is the exception thrown
// last on the calling thread; otherwise empty. For on_exception handlers
// that want what the default report shows. Thread-safe.
[[nodiscard]] std::string throw_trace(const std::exception_ptr& e);

namespace detail {

// Reads the calling thread's last throw; installed once, before main, by
// crew::stacktrace's object, and never removed.
using ThrowTraceReader = std::string (*)(const std::exception_ptr& e);
void set_throw_trace_reader(ThrowTraceReader reader) noexcept;

}  // namespace detail
}  // namespace crew
