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
#include <vector>

#include "common/error.h"
#include "python/src/bindings.h"
#include "python/src/settings_class.h"
#include "server/host/stream_host.h"
#include "server/serve/serve.h"
#include "server/serve/serve_cli.h"

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

}  // namespace

void bind_serve(py::module_& m) {
#ifdef BATCHCAST_HAVE_NVJPEG
  m.attr("has_nvjpeg") = true;  // this build decodes with nvJPEG (serve --decoder nvjpeg)
#else
  m.attr("has_nvjpeg") = false;
#endif
  SettingsClass<ServeConfig>(
      m, "ServeConfig",
      "Every setting of `batchcast serve` (its --help has each one's meaning; fields are the "
      "options' names with _ for -). Keyword construction; fields left out keep their defaults.")
      .field("data", &ServeConfig::data, "image folder (ImageFolder layout)")
      .field("file_list", &ServeConfig::file_list, "text file of 'path label' lines")
      .field("synthetic", &ServeConfig::synthetic, "serve N synthetic samples")
      .field("sample_bytes", &ServeConfig::sample_bytes, "bytes per synthetic sample")
      .named("on_error", &ServeConfig::on_error, ServeConfig::kOnError, "'raise' or 'skip'")
      .field("endpoint", &ServeConfig::endpoint, "'' : the per-user default ipc endpoint")
      .field("listen_all", &ServeConfig::listen_all, "tcp://*:PORT on every interface")
      .field("batch_size", &ServeConfig::batch_size, "samples per chunk")
      .field("ring", &ServeConfig::ring, "slots in the shared pool (0: sized by ring_memory)")
      .field("ring_memory", &ServeConfig::ring_memory,
             "bytes of shared memory for a ring sized by memory (0: the host's default)")
      .field("workers", &ServeConfig::workers, "decoding threads")
      .field("min_consumers", &ServeConfig::min_consumers, "consumers to wait for")
      .field("transform", &ServeConfig::transform,
             "the PipelineOptions (its seed: shuffling's and augmentation's)")
      .field("views", &ServeConfig::views,
             "further views from the first chunk on: view texts (docs/views.md)")
      .field("device", &ServeConfig::device, "'cpu', 'cuda:K', 'cuda:0,cuda:1', 'all', ...")
      .named("decoder", &ServeConfig::decoder, ServeConfig::kDecoders, "'cpu', 'nvjpeg' or 'mixed'")
      .field("epochs", &ServeConfig::epochs, "epochs to serve (0: until stopped)")
      .field("shuffle", &ServeConfig::shuffle, "shuffle every epoch")
      .field("rank", &ServeConfig::rank, "this server's shard")
      .field("world_size", &ServeConfig::world_size, "number of shards")
      .field("every_rank", &ServeConfig::every_rank, "every rank's shard from this process")
      .named("stall_policy", &ServeConfig::stall_policy, ServeConfig::kStallPolicies,
             "'decouple', 'wait' or 'skip'")
      .field("stall_timeout", &ServeConfig::stall_timeout, "seconds a consumer may stall")
      .field("metrics_dir", &ServeConfig::metrics_dir, "'' : no metrics")
      .field("metrics_interval", &ServeConfig::metrics_interval, "seconds between samples")
      .field("status_interval", &ServeConfig::status_interval, "seconds between status lines")
      .field("fail_linger", &ServeConfig::fail_linger, "seconds to answer after a failure")
      .finish()
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
