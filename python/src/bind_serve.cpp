// Python bindings of ServeConfig (server/serve/serve_config.h, a typed class whose `transform` is a
// PipelineOptions) and ServeRun (server/serve/serve.h): the native `batchcast serve` inside a
// Python process, configured by a ServeConfig built directly (no argument strings). The share
// producer of batchcast.DataLoader runs it for pipelines _torchvision_plan recognises, and
// watches its consumer counts to decide when to exit, as it does for a Python Producer.
// command_line() is the way to the program in another process (batchcast.serve()).
//
// Thin: the constructor (dataset scan, bind) and wait() release the GIL; stop() may be called
// from any thread while wait() blocks. close() destroys the server (pool and socket removed).
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "common/named.h"
#include "python/src/bindings.h"
#include "python/src/settings_class.h"
#include "server/host/stream_host.h"
#include "server/serve/serve.h"
#include "server/serve/serve_cli.h"
#include "server/serve/serve_options.h"

namespace py = pybind11;

namespace batchcast::python {
namespace {

class PyServeRun {
 public:
  explicit PyServeRun(ServeConfig config) {
    config.validate();
    py::gil_scoped_release nogil;
    server_ = std::make_unique<ServeRun>(config);
  }
  int wait() {
    ServeRun& s = get();
    py::gil_scoped_release nogil;
    return s.wait();
  }
  void stop() { get().stop(); }
  void close() {
    py::gil_scoped_release nogil;
    server_.reset();
  }
  const StreamHost& core() { return get().core(); }

 private:
  ServeRun& get() {
    if (!server_) throw Error("this ServeRun is closed");
    return *server_;
  }
  std::unique_ptr<ServeRun> server_;
};

// ServeConfig.options(): one row per option, in --help's order.
py::list option_rows() {
  py::list rows;
  const ServeConfig d;
  auto row = [&](const std::string& name, const ServeOption& o, const std::string& type) {
    py::dict r;
    r["name"] = name;
    r["flag"] = o.flag_text();
    r["group"] = o.group;
    r["type"] = type;
    r["env"] = o.env ? py::object(py::str(o.env)) : py::object(py::none());
    r["help"] = o.help;
    rows.append(r);
  };
  auto type_of = [](auto value, auto names) -> std::string {
    using T = decltype(value);
    if (names) return names_joined(*names, "|");
    if constexpr (std::is_same_v<T, bool>) return "flag";
    if constexpr (std::is_same_v<T, std::string>) return "text";
    if constexpr (std::is_same_v<T, std::vector<std::string>>) return "text, repeated";
    if constexpr (std::is_floating_point_v<T>) return "number";
    if constexpr (std::is_integral_v<T>) return "integer";
    return "numbers";
  };
  for_each_serve_setting([&](const ServeOption& o, auto member, auto names) {
    row(o.name, o,
        o.check == ServeOption::Check::kByteSize ? "bytes" : type_of(d.*member, names));
  });
  for_each_view_field([&](const ViewField& f, auto member, auto names) {
    const ServeOption o = view_field_option(f);
    row(std::string("transform.") + f.option, o,
        o.inverted ? "flag" : type_of(d.transform.*member, names));
  });
  return rows;
}

}  // namespace

void bind_serve(py::module_& m) {
#ifdef BATCHCAST_HAVE_NVJPEG
  m.attr("has_nvjpeg") = true;  // this build decodes with nvJPEG (serve --decoder nvjpeg)
#else
  m.attr("has_nvjpeg") = false;
#endif
  SettingsClass<ServeConfig> config(
      m, "ServeConfig",
      "Every setting of `batchcast serve` (ServeConfig.options() lists each one with its flag, "
      "group, default and help). Keyword construction; fields left out keep their defaults.");
  for_each_serve_setting([&](const ServeOption& o, auto member, auto names) {
    config.declared(o.name, member, names, o.help);
  });
  config.field("transform", &ServeConfig::transform,
               "the PipelineOptions (its seed: shuffling's and augmentation's)");
  config.finish()
      .def_static("options", &option_rows,
                  "Every option as a dict (name: the field, or transform.FIELD; flag; group; "
                  "type; env; help), in --help's order (defaults: ServeConfig()'s fields): "
                  "what docs/options.md and the .pyi stub are checked against.")
      .def(
          "validate", [](const ServeConfig& c) { ServeConfig(c).validate(); },
          "Checks the settings against each other as the server does; raises BatchcastError "
          "naming the options and the fix.")
      .def("command_line", &serve_command_line,
           "The arguments of `batchcast serve` (after `serve`) that give these settings.");

  py::class_<PyServeRun>(
      m, "ServeRun",
      "`batchcast serve` in this process, for a ServeConfig (validated as the program does). "
      "wait() blocks until it ends; stop() ends it from another thread; close() removes its "
      "pool and socket.")
      .def(py::init<ServeConfig>(), py::arg("config"))
      .def("wait", &PyServeRun::wait)
      .def("stop", &PyServeRun::stop)
      .def("close", &PyServeRun::close)
      .def_property_readonly("consumers_now",
                             [](PyServeRun& s) { return s.core().consumers_now(); })
      .def_property_readonly("consumers_reading",
                             [](PyServeRun& s) { return s.core().consumers_reading(); })
      .def_property_readonly("consumers_ever",
                             [](PyServeRun& s) { return s.core().consumers_ever(); })
      .def_property_readonly("endpoint", [](PyServeRun& s) { return s.core().endpoint(); })
      .def_property_readonly("on_gpu",
                             [](PyServeRun& s) { return s.core().memory().cuda_device() >= 0; });
}

}  // namespace batchcast::python
