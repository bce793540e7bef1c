# Finds batchcast's dependencies: find_package(CONFIG) where the Debian package ships a
# relocatable config (spdlog with its fmt, CLI11, nlohmann_json, dlpack, Boost, GTest,
# pybind11), bc_find_library.cmake where it does not (ZeroMQ, TurboJPEG, OpenCV, libpng,
# libtiff, libwebp).
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
# The other formats torchvision's ImageFolder accepts (decoders/image_decode.h): libpng,
# libtiff and libwebp's demuxer (its animation decoder reads every WebP file, as Pillow's does).
# Shared in every build: the wheel bundles them as it bundles TurboJPEG (setup.py).
bc_find_library(PNG HEADER png.h LIBS png16)
bc_find_library(TIFF HEADER tiffio.h LIBS tiff)
bc_find_library(WebP HEADER webp/demux.h LIBS webpdemux webp)
if(NOT PNG_FOUND OR NOT TIFF_FOUND OR NOT WebP_FOUND)
  message(FATAL_ERROR "libpng, libtiff or libwebp not found: install libpng-dev, libtiff-dev "
    "and libwebp-dev")
endif()
# The decoder tests compare against OpenCV's imgcodecs, an independent decoder, where it is
# installed (not in the static build, nor in the GPU node's bundle): test-only.
if(NOT BATCHCAST_STATIC_DEPS)
  find_library(OPENCV_IMGCODECS_LIBRARY NAMES opencv_imgcodecs)
endif()
if(OPENCV_IMGCODECS_LIBRARY)
  add_library(OpenCV::imgcodecs INTERFACE IMPORTED GLOBAL)
  target_link_libraries(OpenCV::imgcodecs INTERFACE ${OPENCV_IMGCODECS_LIBRARY} OpenCV::OpenCV)
endif()

find_package(spdlog CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(dlpack CONFIG REQUIRED)
find_package(Boost REQUIRED)
find_package(Threads REQUIRED)
