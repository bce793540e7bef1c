#include "python/src/bindings.h"

namespace batchcast::python {
void bind_common(pybind11::module_&) {}
}  // namespace batchcast::python
