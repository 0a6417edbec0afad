# crew_warnings: the warnings of crew's own targets (never exported to
# users). Warnings only: the sanitizer hooks are crew_sanitizer_hooks
# (CrewSanitizers.cmake).
add_library(crew_warnings INTERFACE)
target_compile_options(crew_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion -Wnon-virtual-dtor
  -Wold-style-cast -Woverloaded-virtual -Wnull-dereference
  $<$<CXX_COMPILER_ID:Clang>:-Wthread-safety>)

