// Python bindings of the metrics collector (metrics/collector.h, metrics/process_tracker.h).
//
// - ProcessTracker: what batchcast.tools.metrics.track() uses. Its sampler thread never touches
//   Python (counters are atomics), so it keeps sampling while Python code holds the GIL.
// - MetricsCollector: a collector whose snapshot comes from a Python callable returning a dict
//   (keys of MetricsSnapshot; "processes" a list of dicts with role, id, pid, samples, wait_s).
//   The callable runs on the sampler thread with the GIL taken there. A process dict may also
//   carry since_start (bool) and exact_cpu_s (float or None), as MetricsSnapshot::Process.
// - collocation_mode(): metrics/collocation.h's detection, for `batchcast bench` and reports.
// start()/stop() release the GIL: start() waits for the first tick and stop() joins the thread,
// both of which may need the GIL in the callback. Summaries come back as Python dicts.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <memory>

#include "common/error.h"
#include "metrics/collector.h"
#include "metrics/collocation.h"
#include "metrics/nvml.h"
#include "metrics/process_tracker.h"
#include "python/src/bindings.h"

namespace batchcast::python {
namespace py = pybind11;

namespace {

py::object to_python(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

CollectorOptions make_options(std::string dir, double interval, std::string run_name, bool gpu,
                              std::string nvml_library) {
  CollectorOptions o;
  o.dir = std::move(dir);
  o.interval_s = interval;
  o.run_name = std::move(run_name);
  o.gpu = gpu;
  if (!nvml_library.empty()) o.nvml_library = std::move(nvml_library);
  return o;
}

// Reads a snapshot dict; requires the GIL.
MetricsSnapshot snapshot_from(const py::handle& obj) {
  MetricsSnapshot s;
  if (obj.is_none()) return s;
  py::dict d = py::reinterpret_borrow<py::dict>(obj);
  if (d.contains("producer_blocked_s"))
    s.producer_blocked_s = d["producer_blocked_s"].cast<double>();
  if (d.contains("ring_used")) s.ring_used = d["ring_used"].cast<int64_t>();
  if (d.contains("ring_size")) s.ring_size = d["ring_size"].cast<int64_t>();
  if (d.contains("processes")) {
    for (const py::handle& h : d["processes"]) {
      py::dict p = py::reinterpret_borrow<py::dict>(h);
      MetricsSnapshot::Process proc;
      proc.role = p.contains("role") ? p["role"].cast<std::string>() : "consumer";
      proc.id = p.contains("id") ? py::str(p["id"]).cast<std::string>() : "";
      proc.pid = p["pid"].cast<pid_t>();
      if (p.contains("samples")) proc.samples = p["samples"].cast<uint64_t>();
      if (p.contains("wait_s")) proc.wait_s = p["wait_s"].cast<double>();
      if (p.contains("since_start")) proc.since_start = p["since_start"].cast<bool>();
      if (p.contains("exact_cpu_s") && !p["exact_cpu_s"].is_none())
        proc.exact_cpu_s = p["exact_cpu_s"].cast<double>();
      s.processes.push_back(std::move(proc));
    }
  }
  return s;
}

// Owns a collector fed by a Python callable. The destructor stops the collector with the GIL
// released (its final tick calls the callable, which takes the GIL) before the callable is
// dropped with the GIL held.
class PyCollector {
 public:
  PyCollector(CollectorOptions options, py::function source)
      : source_(std::make_shared<py::function>(std::move(source))) {
    std::weak_ptr<py::function> weak = source_;
    collector_ = std::make_unique<MetricsCollector>(std::move(options), [weak] {
      py::gil_scoped_acquire gil;
      auto fn = weak.lock();
      if (!fn) return MetricsSnapshot{};
      try {
        return snapshot_from((*fn)());
      } catch (py::error_already_set& e) {
        throw Error(std::string("Python snapshot source raised: ") + e.what());
      }
    });
  }
  ~PyCollector() {
    {
      py::gil_scoped_release nogil;
      try {
        collector_->stop();
      } catch (const std::exception&) {
        // A destructor has nobody to tell; an explicit stop() raises the same error.
      }
      collector_.reset();
    }
    source_.reset();  // with the GIL held again
  }
  MetricsCollector& collector() { return *collector_; }

 private:
  std::shared_ptr<py::function> source_;
  std::unique_ptr<MetricsCollector> collector_;
};

}  // namespace

void bind_metrics(py::module_& m) {
  py::class_<ProcessTracker>(m, "ProcessTracker",
                             "Records this process (and its live child processes) in the "
                             "collector's format; counters fed with add_samples()/add_wait().")
      .def(py::init([](std::string dir, std::string role, std::string id, double interval,
                       std::string run_name, bool gpu, std::string nvml_library,
                       bool since_start) {
             return std::make_unique<ProcessTracker>(
                 make_options(std::move(dir), interval, std::move(run_name), gpu,
                              std::move(nvml_library)),
                 std::move(role), std::move(id), since_start);
           }),
           py::arg("dir"), py::arg("role") = "trainer", py::arg("id") = "",
           py::arg("interval") = 1.0, py::arg("run_name") = "", py::arg("gpu") = true,
           py::arg("nvml_library") = "", py::arg("since_start") = false)
      .def("start", &ProcessTracker::start, py::call_guard<py::gil_scoped_release>())
      .def("stop", &ProcessTracker::stop, py::call_guard<py::gil_scoped_release>())
      .def("add_samples", &ProcessTracker::add_samples, py::arg("n"))
      .def("add_wait", &ProcessTracker::add_wait, py::arg("seconds"))
      .def("summary",
           [](const ProcessTracker& t) {
             nlohmann::json j;
             {
               py::gil_scoped_release nogil;
               j = t.summary();
             }
             return to_python(j);
           })
      .def_property_readonly("samples", &ProcessTracker::samples)
      .def_property_readonly("wait_s", &ProcessTracker::wait_s);

  py::class_<PyCollector>(m, "MetricsCollector",
                          "A collector whose snapshot comes from a Python callable returning a "
                          "dict: producer_blocked_s, ring_used, ring_size, processes=[{role, id, "
                          "pid, samples, wait_s}].")
      .def(py::init([](std::string dir, py::function source, double interval, std::string run_name,
                       bool gpu, std::string nvml_library) {
             return std::make_unique<PyCollector>(
                 make_options(std::move(dir), interval, std::move(run_name), gpu,
                              std::move(nvml_library)),
                 std::move(source));
           }),
           py::arg("dir"), py::arg("source"), py::arg("interval") = 1.0, py::arg("run_name") = "",
           py::arg("gpu") = true, py::arg("nvml_library") = "")
      .def(
          "start", [](PyCollector& c) { c.collector().start(); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "stop", [](PyCollector& c) { c.collector().stop(); },
          py::call_guard<py::gil_scoped_release>())
      .def("summary",
           [](PyCollector& c) {
             nlohmann::json j;
             {
               py::gil_scoped_release nogil;
               j = c.collector().summary();
             }
             return to_python(j);
           })
      .def_property_readonly("collocation",
                             [](PyCollector& c) { return c.collector().collocation(); });

  m.def(
      "collocation_mode",
      [](std::string nvml_library) {
        std::optional<metrics::Nvml> nvml =
            metrics::Nvml::open(nvml_library.empty() ? "libnvidia-ml.so.1" : nvml_library, nullptr);
        return metrics::detect_collocation(nvml ? &*nvml : nullptr);
      },
      py::arg("nvml_library") = "", py::call_guard<py::gil_scoped_release>(),
      "\"mig\", \"mps\", \"time-slicing\" or \"none\" (metrics/collocation.h).");
}

}  // namespace batchcast::python
