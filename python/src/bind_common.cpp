// Python bindings shared by every component: the exception hierarchy and small helpers.
//
// C++ exceptions become Python ones with their messages kept:
//   batchcast::Error           -> batchcast.BatchcastError (a RuntimeError)
//   batchcast::ServerGoneError -> batchcast.ServerGoneError
//   batchcast::TimeoutError    -> batchcast.TimeoutError (also a builtin TimeoutError)
//   batchcast::SampleError     -> batchcast.SampleError
//   batchcast::PositionUnavailableError -> batchcast.PositionUnavailableError
// The classes live in _batchcast and are re-exported by the package under these names.
#include <pybind11/stl.h>

#include "common/error.h"
#include "protocol/endpoint.h"
#include "protocol/messages.h"
#include "python/src/bindings.h"

namespace py = pybind11;

namespace batchcast::python {
namespace {

// Exception classes: created once per process, alive for the interpreter's lifetime.
PyObject* g_error = nullptr;
PyObject* g_server_gone = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_sample = nullptr;
PyObject* g_position = nullptr;

PyObject* new_exception(const char* name, PyObject* bases, const char* doc) {
  PyObject* cls = PyErr_NewExceptionWithDoc(name, doc, bases, nullptr);
  if (!cls) throw py::error_already_set();
  return cls;
}

}  // namespace

void bind_common(py::module_& m) {
  g_error = new_exception("batchcast.BatchcastError", PyExc_RuntimeError,
                          "Base class of every error batchcast raises.");
  py::tuple error_bases = py::make_tuple(py::handle(g_error));
  g_server_gone = new_exception("batchcast.ServerGoneError", error_bases.ptr(),
                                "The server went away (exited, killed, or silent).");
  py::tuple timeout_bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_TimeoutError));
  g_timeout = new_exception("batchcast.TimeoutError", timeout_bases.ptr(),
                            "A wait ran out (no server answered, or no data came in time).");
  g_sample = new_exception("batchcast.SampleError", error_bases.ptr(),
                           "A sample cannot be decoded; the message names the file and reason.");
  g_position = new_exception("batchcast.PositionUnavailableError", error_bases.ptr(),
                             "A sought position the server no longer holds and cannot produce "
                             "again; the consumer stays attached and may seek elsewhere.");
  m.attr("BatchcastError") = py::handle(g_error);
  m.attr("PositionUnavailableError") = py::handle(g_position);
  m.attr("ServerGoneError") = py::handle(g_server_gone);
  m.attr("TimeoutError") = py::handle(g_timeout);
  m.attr("SampleError") = py::handle(g_sample);

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ServerGoneError& e) {
      PyErr_SetString(g_server_gone, e.what());
    } catch (const TimeoutError& e) {
      PyErr_SetString(g_timeout, e.what());
    } catch (const SampleError& e) {
      PyErr_SetString(g_sample, e.what());
    } catch (const PositionUnavailableError& e) {
      PyErr_SetString(g_position, e.what());
    } catch (const Error& e) {
      PyErr_SetString(g_error, e.what());
    }
  });

  m.def("default_endpoint", &protocol::default_endpoint,
        "The endpoint used when none is given: ipc:///tmp/batchcast-<uid>.sock.");
  m.def("rank_endpoint", &protocol::rank_endpoint, py::arg("endpoint"), py::arg("rank"),
        "Rank `rank`'s endpoint of a server that serves every rank (serve --every-rank): "
        "ipc://PATH.rank<rank>, or tcp://HOST:<PORT + rank>.");
}

}  // namespace batchcast::python
