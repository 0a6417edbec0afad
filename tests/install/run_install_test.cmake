# cmake -P script behind the install.find_package_consumer test (see
# install_test.cmake for the arguments). Fails on the first step that fails.
cmake_minimum_required(VERSION 3.20)

foreach(var CREW_BUILD_DIR WORK_DIR CONSUMER_SOURCE_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_install_test.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/consumer-build")
# Start clean so a stale install cannot hide a broken one.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(config_args "")
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()

function(step name)
  string(JOIN " " command ${ARGN})
  message(STATUS "install test: ${name}: ${command}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test: ${name} failed (${rc})")
  endif()
endfunction()

step("install" "${CMAKE_COMMAND}" --install "${CREW_BUILD_DIR}" --prefix "${prefix}"
  ${config_args})

# The installed detail headers are what the public headers' inline templates
# instantiate, no more: the list changes only on purpose.
file(GLOB installed_detail RELATIVE "${prefix}/include" "${prefix}/include/crew/detail/*")
list(SORT installed_detail)
file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/installed_detail_headers.txt" expected_detail
     REGEX "^crew/")
list(SORT expected_detail)
if(NOT installed_detail STREQUAL expected_detail)
  set(extra ${installed_detail})
  list(REMOVE_ITEM extra ${expected_detail})
  set(missing ${expected_detail})
  list(REMOVE_ITEM missing ${installed_detail})
  message(FATAL_ERROR "install test: the installed crew/detail headers differ from "
                      "tests/install/installed_detail_headers.txt; installed but not listed: "
                      "${extra}; listed but not installed: ${missing}")
endif()

set(configure_args
  -S "${CONSUMER_SOURCE_DIR}" -B "${consumer_build}"
  -G "${GENERATOR}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  "-DCMAKE_PREFIX_PATH=${prefix}")
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CONFIG)
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
step("configure consumer" "${CMAKE_COMMAND}" ${configure_args})
step("build consumer" "${CMAKE_COMMAND}" --build "${consumer_build}" ${config_args})

# Single-config generators put the binary at the top; multi-config ones in
# a per-config folder.
set(consumer "${consumer_build}/consumer")
if(NOT EXISTS "${consumer}" AND CONFIG)
  set(consumer "${consumer_build}/${CONFIG}/consumer")
endif()
step("run consumer" "${consumer}")
message(STATUS "install test: passed")
