# crew_warnings: the warnings of crew's own targets (never exported to
# users). Warnings only: the sanitizer hooks are crew_sanitizer_hooks
# (CrewSanitizers.cmake).
#
# -Wnull-dereference is left out, with g++ only, of a target that calls
# crew_no_null_dereference_warning(): g++ reports it inside the inlined code
# of Asio, Beast and CLI11. A target's own -Wno-null-dereference would not
# do: a target's options come before those of the libraries it links, and
# the later option wins.
add_library(crew_warnings INTERFACE)
target_compile_options(crew_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion -Wnon-virtual-dtor
  -Wold-style-cast -Woverloaded-virtual
  $<$<OR:$<CXX_COMPILER_ID:Clang>,$<NOT:$<BOOL:$<TARGET_PROPERTY:CREW_NO_NULL_DEREFERENCE_WARNING>>>>:-Wnull-dereference>
  $<$<CXX_COMPILER_ID:Clang>:-Wthread-safety>)

function(crew_no_null_dereference_warning)
  set_target_properties(${ARGN} PROPERTIES CREW_NO_NULL_DEREFERENCE_WARNING ON)
endfunction()

