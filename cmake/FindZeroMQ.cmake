# Finds libzmq and the cppzmq header (zmq.hpp): ZeroMQ::ZeroMQ. Debian's libzmq3-dev ships no
# CMake config (cppzmq's own config falls back to pkg-config, which ignores CMAKE_PREFIX_PATH).
# Always the shared library: Debian's libzmq.a is not position-independent (it cannot go into
# the Python module), so the relocatable wheel bundles libzmq.so.5 instead (setup.py).
include(${CMAKE_CURRENT_LIST_DIR}/bc_find_library.cmake)
bc_find_library(ZeroMQ HEADER zmq.hpp LIBS zmq)
