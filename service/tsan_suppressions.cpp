// ThreadSanitizer suppressions built into crewd when it is compiled with
// -fsanitize=thread (CREW_SANITIZE=thread, `make tsan`).
//
// Debian's libcpp-httplib is not instrumented. It matches requests against
// function-local static std::regex objects: the first connection thread
// constructs one under __cxa_guard_acquire (which TSan sees), later threads
// take the guard's inline fast path, a plain acquire load in the library's
// uninstrumented code (which TSan does not see), and then read the regex's
// memory through memcmp. TSan reports that as a race between two http
// workers although the guard orders it. Only interceptor calls made from
// inside that library are ignored; crewd's own code stays fully checked.
#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libcpp-httplib.so\n";
}
#endif
