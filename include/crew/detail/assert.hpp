// crew/detail/assert.hpp: CREW_ASSERT, for invariants whose violation is a
// bug in crew (an illegal state transition, say). Checked when
// CREW_ENABLE_ASSERTS is defined: in Debug builds and in the sanitizer
// builds (see CMakeLists.txt); compiled out otherwise.
#pragma once

#if defined(CREW_ENABLE_ASSERTS)
#include <cstdio>
#include <cstdlib>

namespace crew::detail {
[[noreturn]] inline void assert_failed(const char* what, const char* file, int line) noexcept {
  std::fprintf(stderr, "crew: internal invariant violated at %s:%d: %s\n", file, line, what);
  std::abort();
}
}  // namespace crew::detail

#define CREW_ASSERT(cond, what) \
  ((cond) ? static_cast<void>(0) : ::crew::detail::assert_failed(what, __FILE__, __LINE__))
#else
#define CREW_ASSERT(cond, what) static_cast<void>(0)
#endif
