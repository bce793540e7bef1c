#include "python/src/bindings.h"

namespace batchcast::python {
void bind_server(pybind11::module_&) {}
}  // namespace batchcast::python
