# bc_find_library(<Name> HEADER <h> [LIBS <names...>] [SHARED_WITH <names...>]): an imported
# target <Name>::<Name>, for the dependencies whose Debian packages ship no usable CMake config
# (libzmq3-dev and libopencv-*-dev ship none; libjpeg-turbo's hard-codes /usr, which breaks the
# GPU node's unpacked-bundle prefix). Found by header and library name under CMAKE_PREFIX_PATH,
# so one line works with Debian's packages and with scripts/make_gpu_bundle.sh's prefix.
# With <Name>_USE_STATIC_LIBS, LIBS are linked from their .a archives and SHARED_WITH (what
# those archives need that has no archive) as shared libraries.
# Installed with batchcast's CMake package: its config finds ZeroMQ the same way.
include_guard(GLOBAL)
include(FindPackageHandleStandardArgs)

function(bc_find_library name)
  cmake_parse_arguments(ARG "" "HEADER" "LIBS;SHARED_WITH" ${ARGN})
  if(TARGET ${name}::${name})
    return()
  endif()
  find_path(${name}_INCLUDE_DIR ${ARG_HEADER} PATH_SUFFIXES opencv4)
  set(required ${name}_INCLUDE_DIR)
  set(libs)
  foreach(lib ${ARG_LIBS})
    if(${name}_USE_STATIC_LIBS)
      set(var ${name}_${lib}_STATIC_LIBRARY)
      find_library(${var} NAMES lib${lib}.a)
    else()
      set(var ${name}_${lib}_LIBRARY)
      find_library(${var} NAMES ${lib})
    endif()
    list(APPEND required ${var})
    list(APPEND libs ${${var}})
  endforeach()
  if(${name}_USE_STATIC_LIBS)
    list(APPEND libs ${ARG_SHARED_WITH})
  endif()
  find_package_handle_standard_args(${name} REQUIRED_VARS ${required})
  if(${name}_FOUND)
    add_library(${name}::${name} INTERFACE IMPORTED GLOBAL)
    target_include_directories(${name}::${name} SYSTEM INTERFACE ${${name}_INCLUDE_DIR})
    target_link_libraries(${name}::${name} INTERFACE ${libs})
  endif()
  set(${name}_FOUND ${${name}_FOUND} PARENT_SCOPE)
endfunction()
