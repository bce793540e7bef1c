// Python binding of RunningServer (server/serve.h): the native `batchcast serve` inside a Python
// process, configured by the same arguments as the command line. The share producer of
// batchcast.DataLoader runs it for pipelines torchvision_plan recognises, and watches its
// consumer counts to decide when to exit, as it does for a Python Producer.
//
// Thin: the constructor (dataset scan, bind) and wait() release the GIL; stop() may be called
// from any thread while wait() blocks. close() destroys the server (pool and socket removed).
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "python/src/bindings.h"
#include "server/serve.h"
#include "server/serve_cli.h"
#include "server/server_core.h"

namespace py = pybind11;

namespace batchcast::python {
namespace {

class PyRunningServer {
 public:
  explicit PyRunningServer(const std::vector<std::string>& args) {
    ServeConfig config = parse_serve_args(args);
    py::gil_scoped_release nogil;
    server_ = std::make_unique<RunningServer>(config);
  }
  int wait() {
    RunningServer& s = get();
    py::gil_scoped_release nogil;
    return s.wait();
  }
  void stop() { get().stop(); }
  void close() {
    py::gil_scoped_release nogil;
    server_.reset();
  }
  const ServerCore& core() { return get().core(); }

 private:
  RunningServer& get() {
    if (!server_) throw Error("this RunningServer is closed");
    return *server_;
  }
  std::unique_ptr<RunningServer> server_;
};

}  // namespace

void bind_serve(py::module_& m) {
#ifdef BATCHCAST_HAVE_NVJPEG
  m.attr("has_nvjpeg") = true;  // this build decodes with nvJPEG (serve --decoder nvjpeg)
#else
  m.attr("has_nvjpeg") = false;
#endif
  py::class_<PyRunningServer>(
      m, "RunningServer",
      "`batchcast serve ARGS...` in this process (ARGS: the command line's options). "
      "wait() blocks until it ends; stop() ends it from another thread; close() removes its "
      "pool and socket.")
      .def(py::init<const std::vector<std::string>&>(), py::arg("args"))
      .def("wait", &PyRunningServer::wait)
      .def("stop", &PyRunningServer::stop)
      .def("close", &PyRunningServer::close)
      .def_property_readonly("consumers_now",
                             [](PyRunningServer& s) { return s.core().consumers_now(); })
      .def_property_readonly("consumers_reading",
                             [](PyRunningServer& s) { return s.core().consumers_reading(); })
      .def_property_readonly("consumers_ever",
                             [](PyRunningServer& s) { return s.core().consumers_ever(); })
      .def_property_readonly("endpoint", [](PyRunningServer& s) { return s.core().endpoint(); })
      .def_property_readonly(
          "on_gpu", [](PyRunningServer& s) { return s.core().memory().cuda_device() >= 0; });
}

}  // namespace batchcast::python
