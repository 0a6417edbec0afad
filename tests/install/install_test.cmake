# install.find_package_consumer: installs this build into a scratch prefix,
# then configures, builds and runs tests/install/consumer/ against it with
# find_package(crew). Included from tests/CMakeLists.txt.

# Not in sanitizer builds: the installed libcrew.a would be instrumented, and
# the consumer (built without -fsanitize) would fail to link against it.
if(CREW_SANITIZE)
  return()
endif()

add_test(NAME install.find_package_consumer
  COMMAND ${CMAKE_COMMAND}
    -DCREW_BUILD_DIR=${PROJECT_BINARY_DIR}
    -DWORK_DIR=${PROJECT_BINARY_DIR}/install-test
    -DCONSUMER_SOURCE_DIR=${CMAKE_CURRENT_LIST_DIR}/consumer
    -DCONFIG=$<CONFIG>
    "-DGENERATOR=${CMAKE_GENERATOR}"
    "-DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}"
    "-DCXX_COMPILER=${CMAKE_CXX_COMPILER}"
    -P ${CMAKE_CURRENT_LIST_DIR}/run_install_test.cmake)
set_tests_properties(install.find_package_consumer PROPERTIES
  TIMEOUT 300
  LABELS install)
