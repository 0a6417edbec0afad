// crew/detail/thread_annotations.hpp: clang -Wthread-safety attributes, so
// the compiler checks which lock guards which member. Empty on other compilers.
#pragma once

#if defined(__clang__)
#define CREW_TSA(x) __attribute__((x))
#else
#define CREW_TSA(x)
#endif

#define CREW_CAPABILITY(x) CREW_TSA(capability(x))
#define CREW_SCOPED_CAPABILITY CREW_TSA(scoped_lockable)
#define CREW_GUARDED_BY(x) CREW_TSA(guarded_by(x))
#define CREW_PT_GUARDED_BY(x) CREW_TSA(pt_guarded_by(x))
#define CREW_REQUIRES(...) CREW_TSA(requires_capability(__VA_ARGS__))
#define CREW_ACQUIRE(...) CREW_TSA(acquire_capability(__VA_ARGS__))
#define CREW_RELEASE(...) CREW_TSA(release_capability(__VA_ARGS__))
#define CREW_EXCLUDES(...) CREW_TSA(locks_excluded(__VA_ARGS__))
#define CREW_NO_THREAD_SAFETY_ANALYSIS CREW_TSA(no_thread_safety_analysis)
#define CREW_TRY_ACQUIRE(...) CREW_TSA(try_acquire_capability(__VA_ARGS__))
#define CREW_ASSERT_CAPABILITY(x) CREW_TSA(assert_capability(x))
