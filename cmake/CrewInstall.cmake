# Installation with a CMake package config: find_package(crew), then
# crew::crew and whichever optional targets this build has.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
# Each target installs the headers of its own FILE_SET: an optional target's
# header (crew/metrics.hpp, crew/asio.hpp, ...) only when it was built.
install(TARGETS crew ${crew_installed_targets} EXPORT crewTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT crewTargets NAMESPACE crew:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/crew)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/crewConfig.cmake.in
  ${PROJECT_BINARY_DIR}/crewConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/crew)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/crewConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/crewConfig.cmake ${PROJECT_BINARY_DIR}/crewConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/crew)

