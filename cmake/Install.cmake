# install() and export of the C++ client library, so that a C++ program can
#   find_package(batchcast CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE batchcast::client)
# (tests/cmake_consumer/ proves it). Headers go to <prefix>/include/batchcast/, keeping the
# source tree's paths ("client/consumer.h"). The server, decoders and metrics are not exported:
# their public surface is the `batchcast` program and the Python package.
include(CMakePackageConfigHelpers)

set(BATCHCAST_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/batchcast)
set(client_targets batchcast_common batchcast_protocol batchcast_shm batchcast_slot_memory
  batchcast_client)
if(TARGET batchcast_cuda_pool)
  list(APPEND client_targets batchcast_cuda_pool)
endif()
install(TARGETS ${client_targets} EXPORT batchcastTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/batchcast)
foreach(dir common protocol shm client)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/batchcast
    FILES_MATCHING PATTERN "*.h")
endforeach()
install(EXPORT batchcastTargets NAMESPACE batchcast:: DESTINATION ${BATCHCAST_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/batchcastConfig.cmake.in
  ${PROJECT_BINARY_DIR}/batchcastConfig.cmake INSTALL_DESTINATION ${BATCHCAST_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/batchcastConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/batchcastConfig.cmake
  ${PROJECT_BINARY_DIR}/batchcastConfigVersion.cmake
  ${CMAKE_CURRENT_LIST_DIR}/bc_find_library.cmake ${CMAKE_CURRENT_LIST_DIR}/FindZeroMQ.cmake
  DESTINATION ${BATCHCAST_CMAKE_DIR})
