# crew::redis: crew::StreamSource, a Redis Streams consumer feeding a pool.
# Built when hiredis is found (Debian: libhiredis-dev).
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(HIREDIS QUIET hiredis)
endif()
option(CREW_REDIS "Build crew::redis (needs hiredis; default ON when found)" ${HIREDIS_FOUND})
if(CREW_REDIS)
  if(NOT HIREDIS_FOUND)
    message(FATAL_ERROR "CREW_REDIS is ON but hiredis was not found "
      "(Debian: libhiredis-dev; scripts/deps.sh installs it)")
  endif()
  add_library(crew_redis src/stream_source.cpp)
  add_library(crew::redis ALIAS crew_redis)
  target_include_directories(crew_redis PRIVATE ${HIREDIS_INCLUDE_DIRS})
  target_link_libraries(crew_redis PUBLIC crew PRIVATE ${HIREDIS_LIBRARIES}
    $<BUILD_INTERFACE:crew_warnings>)
  set_target_properties(crew_redis PROPERTIES POSITION_INDEPENDENT_CODE ON EXPORT_NAME redis)
  install(TARGETS crew_redis EXPORT crewTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
