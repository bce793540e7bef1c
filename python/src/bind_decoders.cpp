#include "python/src/bindings.h"

namespace batchcast::python {
void bind_decoders(pybind11::module_&) {}
}  // namespace batchcast::python
