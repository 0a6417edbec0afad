# CREW_SANITIZE (thread / address) and what it adds: the sanitizer flags for
# every target, internal assertions, and crew_sanitizer_hooks, which links
# each executable's sanitizer options into it.
# Internal invariants (CREW_ASSERT) are checked in Debug and sanitizer builds.
if(CREW_SANITIZE OR CMAKE_BUILD_TYPE STREQUAL "Debug")
  add_compile_definitions(CREW_ENABLE_ASSERTS)
endif()

# Both sanitizer presets (CMakePresets.json) build with clang++, for CI
# time: it builds them 2-3x faster than g++ (pool_test.cpp with ASan +
# UBSan: 47 s against 168 s), and either build is also a -Wthread-safety
# -Werror build of every target. clang links its TSan runtime into the
# binary with its own operator new and pthread_create, so the test binaries
# that replace those wrap them at link time there (crew_test_replaces in
# tests/CMakeLists.txt).
# Sanitizer builds with clang keep line tables only (-gline-tables-only
# after CMake's -g: the last one wins): reports still show function, file
# and line for every frame, inlined ones included, and the builds are
# faster (submission_test.cpp: TSan 8.3 -> 5.8 s, ASan + UBSan 13.3 ->
# 12.0 s). A debugger then sees no local variables.
if(CREW_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  add_compile_options(-gline-tables-only)
endif()
if(CREW_SANITIZE STREQUAL "thread")
  # -Wno-tsan: g++ warns at every inlined std::atomic_thread_fence that TSan
  # does not model fences. crew's fences order a store before a later load
  # (who sleeps, who spins; barrier.hpp), which TSan's happens-before does
  # not use; the acquire/release pairs it does use are on atomics.
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer
                      $<$<CXX_COMPILER_ID:GNU>:-Wno-tsan>)
  add_link_options(-fsanitize=thread)
elseif(CREW_SANITIZE STREQUAL "address")
  # clang 14's -fsanitize=function (part of `undefined`, C++ only; g++ has
  # no such check) fails to assemble Boost.Asio code ("Cannot represent a
  # difference across sections"), so it is left out.
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
                      $<$<CXX_COMPILER_ID:Clang>:-fno-sanitize=function>)
  add_link_options(-fsanitize=address,undefined)
elseif(NOT CREW_SANITIZE STREQUAL "")
  message(FATAL_ERROR "CREW_SANITIZE must be '', 'thread' or 'address', not '${CREW_SANITIZE}'")
endif()
# A sanitizer build's executables carry their sanitizer options, and the
# TSan suppressions of tests/support/tsan.supp, in themselves
# (cmake/sanitizer_defaults.cpp.in): every executable of the project links
# crew_sanitizer_hooks (through crew_warnings), which adds the generated
# file to executables only.
add_library(crew_sanitizer_hooks INTERFACE)
target_link_libraries(crew_warnings INTERFACE crew_sanitizer_hooks)
if(CREW_SANITIZE)
  file(READ ${PROJECT_SOURCE_DIR}/tests/support/tsan.supp CREW_TSAN_SUPPRESSIONS)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/support/tsan.supp)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/sanitizer_defaults.cpp.in ${PROJECT_BINARY_DIR}/sanitizer_defaults.cpp @ONLY)
  target_sources(crew_sanitizer_hooks INTERFACE
    $<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>:${PROJECT_BINARY_DIR}/sanitizer_defaults.cpp>)
endif()

