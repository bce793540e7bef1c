# Finds batchcast's dependencies by header and library name rather than through package
# configs, so the same lines work with Debian's packages and with an offline bundle unpacked
# into a prefix (scripts/make_gpu_bundle.sh; pass -DCMAKE_PREFIX_PATH=<prefix>/usr).

include(FindPackageHandleStandardArgs)

# bc_find_library(<VAR> HEADER <h> LIBS <names...>): an imported target batchcast::<VAR>.
function(bc_find_library var)
  cmake_parse_arguments(ARG "" "HEADER" "LIBS" ${ARGN})
  find_path(${var}_INCLUDE_DIR ${ARG_HEADER} PATH_SUFFIXES opencv4)
  set(libs)
  foreach(name ${ARG_LIBS})
    find_library(${var}_${name}_LIBRARY NAMES ${name} PATH_SUFFIXES x86_64-linux-gnu)
    list(APPEND libs ${${var}_${name}_LIBRARY})
  endforeach()
  find_package_handle_standard_args(${var} REQUIRED_VARS ${var}_INCLUDE_DIR)
  add_library(batchcast::${var} INTERFACE IMPORTED GLOBAL)
  target_include_directories(batchcast::${var} SYSTEM INTERFACE ${${var}_INCLUDE_DIR})
  if(libs)
    target_link_libraries(batchcast::${var} INTERFACE ${libs})
  endif()
endfunction()

bc_find_library(zmq HEADER zmq.hpp LIBS zmq)
bc_find_library(turbojpeg HEADER turbojpeg.h LIBS turbojpeg)
bc_find_library(opencv HEADER opencv2/core.hpp LIBS opencv_imgproc opencv_core)
bc_find_library(spdlog HEADER spdlog/spdlog.h LIBS spdlog fmt)
target_compile_definitions(batchcast::spdlog INTERFACE SPDLOG_FMT_EXTERNAL SPDLOG_COMPILED_LIB)
bc_find_library(cli11 HEADER CLI/CLI.hpp)
bc_find_library(json HEADER nlohmann/json.hpp)
bc_find_library(dlpack HEADER dlpack/dlpack.h)
find_package(Boost REQUIRED)
find_package(Threads REQUIRED)

# PNG and other non-JPEG formats go through OpenCV's imgcodecs where it is installed.
find_library(OPENCV_IMGCODECS_LIBRARY NAMES opencv_imgcodecs PATH_SUFFIXES x86_64-linux-gnu)
if(OPENCV_IMGCODECS_LIBRARY)
  target_link_libraries(batchcast::opencv INTERFACE ${OPENCV_IMGCODECS_LIBRARY})
  target_compile_definitions(batchcast::opencv INTERFACE BATCHCAST_HAVE_IMGCODECS=1)
else()
  message(STATUS "batchcast: opencv_imgcodecs not found; only JPEG files can be decoded")
endif()
