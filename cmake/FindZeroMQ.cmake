# Finds libzmq and the cppzmq header (zmq.hpp): ZeroMQ::ZeroMQ. Debian's libzmq3-dev ships no
# CMake config (cppzmq's own config falls back to pkg-config, which ignores CMAKE_PREFIX_PATH).
# ZeroMQ_USE_STATIC_LIBS links libzmq.a and the archives it needs (Debian 12's build: sodium,
# PGM, NORM with its protokit, libbsd, libmd); GSSAPI has no archive and stays shared.
include(${CMAKE_CURRENT_LIST_DIR}/bc_find_library.cmake)
bc_find_library(ZeroMQ HEADER zmq.hpp LIBS zmq
  STATIC_WITH sodium pgm norm protokit bsd md SHARED_WITH gssapi_krb5)
