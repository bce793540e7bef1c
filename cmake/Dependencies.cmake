# Finds batchcast's dependencies: find_package(CONFIG) where the Debian package ships a
# relocatable config (spdlog with its fmt, CLI11, nlohmann_json, dlpack, Boost, GTest,
# pybind11), bc_find_library.cmake where it does not (ZeroMQ, TurboJPEG, OpenCV).
# Both work with Debian's packages and with the GPU node's unpacked bundle
# (scripts/make_gpu_bundle.sh; pass -DCMAKE_PREFIX_PATH=<prefix>/usr). BATCHCAST_STATIC_DEPS
# links OpenCV from its archives for the relocatable wheel (setup.py): the only position-
# independent archive of the libraries a base image lacks (its shared build pulls in LAPACK,
# BLAS and gfortran); the wheel bundles the other shared libraries.
include(bc_find_library)

set(OpenCV_USE_STATIC_LIBS ${BATCHCAST_STATIC_DEPS})
find_package(ZeroMQ MODULE REQUIRED)
# libjpeg (jpeglib.h) backs the cropped decode path, TurboJPEG the whole-image one: one
# package (libjpeg-turbo), one target. Shared even for the wheel: Debian's libturbojpeg.a and
# libjpeg.a are not position-independent, so setup.py bundles the shared libraries.
bc_find_library(TurboJPEG HEADER turbojpeg.h LIBS turbojpeg jpeg)
if(NOT TurboJPEG_FOUND)
  message(FATAL_ERROR "libjpeg-turbo not found: install libturbojpeg0-dev and libjpeg62-turbo-dev")
endif()
# OpenCV's static core calls TBB and GLX (interop it never uses here), which have no archive.
bc_find_library(OpenCV HEADER opencv2/core.hpp LIBS opencv_imgproc opencv_core
  SHARED_WITH tbb GLX z ${CMAKE_DL_LIBS})
if(NOT OpenCV_FOUND)
  message(FATAL_ERROR "OpenCV not found: install libopencv-core-dev and libopencv-imgproc-dev")
endif()
# PNG and other non-JPEG formats go through OpenCV's imgcodecs where it is installed. The
# static build leaves it out: its archive needs libpng, libtiff, libwebp, OpenEXR and GDAL.
if(NOT BATCHCAST_STATIC_DEPS)
  find_library(OPENCV_IMGCODECS_LIBRARY NAMES opencv_imgcodecs)
endif()
if(OPENCV_IMGCODECS_LIBRARY)
  target_link_libraries(OpenCV::OpenCV INTERFACE ${OPENCV_IMGCODECS_LIBRARY})
  target_compile_definitions(OpenCV::OpenCV INTERFACE BATCHCAST_HAVE_IMGCODECS=1)
else()
  message(STATUS "batchcast: no OpenCV imgcodecs; only JPEG files can be decoded")
endif()

find_package(spdlog CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(dlpack CONFIG REQUIRED)
find_package(Boost REQUIRED)
find_package(Threads REQUIRED)
