#include "python/src/bindings.h"

namespace batchcast::python {
void bind_consumer(pybind11::module_&) {}
}  // namespace batchcast::python
