# The optional targets' dependencies, found once for the whole project
# (tests and crewd use the same results): each optional target is built
# when what it needs is found, or on request (-DCREW_METRICS=ON ...), which
# then fails here if it is missing.

# crew::metrics, the Prometheus exporter: prometheus-cpp.
find_package(prometheus-cpp CONFIG QUIET)
option(CREW_METRICS "Build crew::metrics (needs prometheus-cpp; default ON when found)"
  ${prometheus-cpp_FOUND})
if(CREW_METRICS AND NOT prometheus-cpp_FOUND)
  message(FATAL_ERROR "CREW_METRICS is ON but prometheus-cpp was not found "
    "(Debian: prometheus-cpp-dev; scripts/deps.sh installs it)")
endif()

# crew::spdlog, the spdlog adapter: built whenever spdlog is found.
find_package(spdlog CONFIG QUIET)
set(CREW_SPDLOG ${spdlog_FOUND})

# crew::asio, the Boost.Asio interop: Boost's headers (Debian: libboost-dev).
find_package(Boost 1.74 CONFIG QUIET)
option(CREW_ASIO "Build crew::asio (needs Boost.Asio headers; default ON when found)" ${Boost_FOUND})
if(CREW_ASIO AND NOT Boost_FOUND)
  message(FATAL_ERROR "CREW_ASIO is ON but Boost was not found "
    "(Debian: libboost-dev; scripts/deps.sh installs it)")
endif()

# crew::redis, the Redis Streams source: hiredis (Debian: libhiredis-dev).
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(HIREDIS QUIET hiredis)
endif()
option(CREW_REDIS "Build crew::redis (needs hiredis; default ON when found)" ${HIREDIS_FOUND})
if(CREW_REDIS AND NOT HIREDIS_FOUND)
  message(FATAL_ERROR "CREW_REDIS is ON but hiredis was not found "
    "(Debian: libhiredis-dev; scripts/deps.sh installs it)")
endif()

# crew::stacktrace, the opt-in stack trace of a task's exception:
# Boost.Stacktrace with its libbacktrace backend (Debian:
# libboost-stacktrace-dev). Only programs that link the target pay for it.
find_package(boost_stacktrace_backtrace 1.74 CONFIG QUIET)
option(CREW_STACKTRACE
  "Build crew::stacktrace (needs Boost.Stacktrace; default ON when found)"
  ${boost_stacktrace_backtrace_FOUND})
if(CREW_STACKTRACE AND NOT boost_stacktrace_backtrace_FOUND)
  message(FATAL_ERROR "CREW_STACKTRACE is ON but Boost.Stacktrace was not found "
    "(Debian: libboost-stacktrace-dev; scripts/deps.sh installs it)")
endif()
