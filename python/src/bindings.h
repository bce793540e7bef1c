// One bind_<component>() per file; module.cpp calls them all. Bindings stay thin: the C++ core
// holds the logic, and every blocking call releases the GIL.
#pragma once

#include <pybind11/pybind11.h>

namespace batchcast::python {

void bind_common(pybind11::module_& m);
void bind_consumer(pybind11::module_& m);
void bind_producer(pybind11::module_& m);
void bind_serve(pybind11::module_& m);
void bind_decoders(pybind11::module_& m);
void bind_metrics(pybind11::module_& m);

}  // namespace batchcast::python
