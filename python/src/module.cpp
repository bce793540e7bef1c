// batchcast._batchcast: the native half of the Python package. Each component binds itself in
// its own file (bindings.h); the Python layer in python/batchcast/ is the documented surface.
#include <spdlog/cfg/env.h>

#include "python/src/bindings.h"

PYBIND11_MODULE(_batchcast, m) {
  m.doc() = "batchcast native core (use the batchcast package, not this module)";
  // The native log's level, in a share producer say: SPDLOG_LEVEL=debug (default info).
  spdlog::cfg::load_env_levels();
  batchcast::python::bind_common(m);
  batchcast::python::bind_consumer(m);
  batchcast::python::bind_producer(m);
  batchcast::python::bind_serve(m);
  batchcast::python::bind_decoders(m);
  batchcast::python::bind_metrics(m);
}
