// Python bindings of the producer side: StreamHostOptions (a typed class), StreamHost(options)
// plus batch publishing (server/produce/chunk_publisher.h), used by batchcast.Producer.
//
// Thin: the constructor (stale-segment cleanup, bind), publish_chunk() (acquire + copy +
// publish), wait_finished() and stop() release the GIL. publish_chunk() runs on a
// BlockingWorker, so Ctrl-C interrupts a producer blocked on a full ring: the core is stopped
// (no chunk is left half-filled) and KeyboardInterrupt propagates. Tensors come in as
// (name, dtype name, shape, data address) tuples; the caller keeps them alive for the call.
// Regeneration (regenerates=True): acquire_private() hands out a leased slot and the chunk
// (epoch, index) to produce again, publish_private() fills and publishes it; both are called
// from the Producer's regeneration thread, with the GIL, and release it while they wait/copy.
#include <pybind11/stl.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "common/error.h"
#include "common/process.h"
#include "python/src/bindings.h"
#include "python/src/blocking_call.h"
#include "python/src/settings_class.h"
#include "server/host/stream_host.h"
#include "server/produce/chunk_publisher.h"

namespace py = pybind11;

namespace batchcast::python {
namespace {

// Where a chunk a Python producer publishes sits in its epoch.
protocol::ChunkPosition chunk_position(uint64_t epoch, uint64_t index_in_epoch,
                                       uint64_t sample_start, uint64_t epoch_samples,
                                       bool epoch_end) {
  protocol::ChunkPosition position;
  position.epoch = epoch;
  position.index_in_epoch = index_in_epoch;
  position.sample_start = sample_start;
  position.epoch_samples = epoch_samples;
  position.epoch_end = epoch_end;
  return position;
}

std::vector<HostTensor> host_tensors(const py::list& tensors) {
  std::vector<HostTensor> out;
  out.reserve(tensors.size());
  for (const py::handle& h : tensors) {
    auto t = h.cast<py::tuple>();
    if (t.size() != 4) throw Error("a tensor is described by (name, dtype, shape, data_ptr)");
    HostTensor ht;
    ht.name = t[0].cast<std::string>();
    ht.dtype = parse_dtype(t[1].cast<std::string>());
    ht.shape = t[2].cast<std::vector<int64_t>>();
    ht.data = reinterpret_cast<const void*>(t[3].cast<uintptr_t>());
    out.push_back(std::move(ht));
  }
  return out;
}

class PyStreamHost {
 public:
  explicit PyStreamHost(StreamHostOptions options) {
    py::gil_scoped_release nogil;
    core_ = std::make_shared<StreamHost>(std::move(options));
  }
  ~PyStreamHost() {
    core_->stop();
    if (worker_.in_flight()) return;  // the detached job owns a reference to the core
    py::gil_scoped_release nogil;
    core_.reset();  // joins the event loop, unlinks the pool and the ipc socket
  }

  bool publish(const py::list& tensors, uint64_t epoch, uint64_t index_in_epoch,
               uint64_t sample_start, uint64_t epoch_samples, bool epoch_end) {
    auto batch = host_tensors(tensors);
    const auto position =
        chunk_position(epoch, index_in_epoch, sample_start, epoch_samples, epoch_end);
    auto ok = std::make_shared<bool>(false);
    worker_.run([core = core_, batch = std::move(batch), position,
                 ok] { *ok = publish_chunk(*core, batch, position); },
                [this] {
                  core_->stop();  // a producer interrupted on a full ring stops serving
                  return true;    // and waits for the copy (the caller's tensors) to be done
                });
    return *ok;
  }

  // A chunk to regenerate: (lease id, epoch, index), or None once the stream is over (or after
  // timeout_s; negative: no limit). Waits in slices so that signals are handled.
  std::optional<std::tuple<uint64_t, uint64_t, uint64_t>> acquire_private(double timeout_s) {
    double deadline = timeout_s < 0 ? 1e300 : monotonic_seconds() + timeout_s;
    while (!stopped_) {
      std::optional<FillLease> lease;
      {
        py::gil_scoped_release nogil;
        lease =
            core_->acquire_private(std::min(0.05, std::max(0.0, deadline - monotonic_seconds())));
      }
      if (lease) {
        leases_[lease->seq] = *lease;
        return std::make_tuple(lease->seq, lease->regenerate->epoch, lease->regenerate->index);
      }
      if (core_->failed() || monotonic_seconds() >= deadline || core_->wait_finished(0))
        return std::nullopt;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    return std::nullopt;
  }

  void publish_private(uint64_t lease_id, const py::list& tensors, uint64_t epoch,
                       uint64_t index_in_epoch, uint64_t sample_start, uint64_t epoch_samples,
                       bool epoch_end) {
    auto it = leases_.find(lease_id);
    if (it == leases_.end())
      throw Error("no regeneration lease " + std::to_string(lease_id) + " (already published?)");
    FillLease lease = it->second;
    leases_.erase(it);
    auto batch = host_tensors(tensors);
    const auto position =
        chunk_position(epoch, index_in_epoch, sample_start, epoch_samples, epoch_end);
    py::gil_scoped_release nogil;  // the caller keeps the tensors alive for the call
    publish_chunk_into(*core_, lease, batch, position);
  }

  // Waits in slices so that signals are handled; false on timeout or once stopped.
  bool wait_finished(double timeout_s) {
    double deadline = timeout_s < 0 ? 1e300 : monotonic_seconds() + timeout_s;
    while (!stopped_) {
      double slice = std::min(0.05, std::max(0.0, deadline - monotonic_seconds()));
      bool done;
      {
        py::gil_scoped_release nogil;
        done = core_->wait_finished(slice);
      }
      if (done) return true;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (monotonic_seconds() >= deadline) return false;
    }
    return false;
  }

  void stop() {
    stopped_ = true;
    py::gil_scoped_release nogil;
    core_->stop();
  }

  StreamHost& core() { return *core_; }

 private:
  std::shared_ptr<StreamHost> core_;
  std::map<uint64_t, FillLease> leases_;  // acquire_private() leases not yet published
  BlockingWorker worker_;
  bool stopped_ = false;
};

// The stream host's options as a typed class (server/host/stream_host.h has each field's
// meaning); the C++ names' unit suffixes are left out, as in ServeConfig. Not bound: the GPU
// pool (cuda_devices: the Python producer publishes host tensors) and views (find_view).
void bind_stream_host_options(py::module_& m) {
  SettingsClass<StreamHostOptions>(
      m, "StreamHostOptions",
      "A StreamHost's settings (server/host/stream_host.h). Keyword construction; fields left "
      "out keep their defaults; slot_bytes is required.",
      FieldNames::kKeywords)
      .field("endpoint", &StreamHostOptions::endpoint, "'' : the per-user default ipc endpoint")
      .field("allow_remote", &StreamHostOptions::allow_remote,
             "let tcp://*:PORT listen on every interface")
      .field("ring_slots", &StreamHostOptions::ring_slots, "slots in the shared pool")
      .field("lead_chunks", &StreamHostOptions::lead_chunks,
             "chunks the producer may fill ahead of every reader; 0: the ring")
      .field("slot_bytes", &StreamHostOptions::slot_bytes, "bytes per slot (required)")
      .field("chunk_size", &StreamHostOptions::chunk_size,
             "samples per chunk, the consumers' default batch size")
      .field("epoch_samples", &StreamHostOptions::epoch_samples, "samples per epoch; 0: unknown")
      .field("epochs", &StreamHostOptions::epochs, "epochs announced; 0: unbounded")
      .field("first_epoch", &StreamHostOptions::first_epoch, "the stream's first epoch")
      .field("min_consumers", &StreamHostOptions::min_consumers, "consumers to wait for")
      .named("stall_policy", &StreamHostOptions::stall_policy, kStallPolicyNames,
             "'decouple', 'wait' or 'skip'")
      .field("stall_timeout", &StreamHostOptions::stall_timeout_s,
             "seconds a consumer may stall before the policy acts")
      .field("heartbeat_interval", &StreamHostOptions::heartbeat_interval_s,
             "seconds between heartbeats")
      .field("heartbeat_timeout", &StreamHostOptions::heartbeat_timeout_s,
             "seconds of silence after which a remote consumer is dropped")
      .field("regenerates", &StreamHostOptions::regenerates,
             "the producer can fill any chunk again (acquire_private)")
      .finish();
}

py::dict stats_dict(const StreamStats& s) {
  py::dict d;
  d["chunks_published"] = s.chunks_published;
  d["chunks_regenerated"] = s.chunks_regenerated;
  d["chunks_skipped"] = s.chunks_skipped;
  d["decouplings"] = s.decouplings;
  d["samples_published"] = s.samples_published;
  d["descriptors_sent"] = s.descriptors_sent;
  d["messages_dropped"] = s.messages_dropped;
  d["consumers_now"] = s.consumers_now;
  d["consumers_ever"] = s.consumers_ever;
  d["consumers_died"] = s.consumers_died;
  d["ring_occupied"] = s.ring_occupied;
  d["ring_slots"] = s.ring_slots;
  d["producer_blocked_s"] = s.producer_blocked_s;
  py::list consumers;
  for (const auto& c : s.consumers) {
    py::dict cd;
    cd["id"] = c.id;
    cd["pid"] = c.pid;
    cd["name"] = c.name;
    cd["samples"] = c.samples;
    cd["wait_s"] = c.wait_s;
    cd["behind"] = c.behind;
    cd["held"] = c.held;
    cd["decoupled"] = c.decoupled;
    cd["holding_s"] = c.holding_s;
    consumers.append(cd);
  }
  d["consumers"] = consumers;
  return d;
}

}  // namespace

void bind_producer(py::module_& m) {
  bind_stream_host_options(m);
  py::class_<PyStreamHost>(
      m, "StreamHost",
      "Native stream host (pool, socket, event loop); use batchcast.Producer instead.")
      .def(py::init<StreamHostOptions>(), py::arg("options"),
           "Creates the pool and binds options.endpoint (GIL released).")
      .def("publish_chunk", &PyStreamHost::publish, py::arg("tensors"), py::arg("epoch"),
           py::arg("index_in_epoch"), py::arg("sample_start"), py::arg("epoch_samples"),
           py::arg("epoch_end"),
           "Copy a batch [(name, dtype, shape, data_ptr), ...] into a slot and publish it; "
           "False once the server was stopped.")
      .def("acquire_private", &PyStreamHost::acquire_private, py::arg("timeout") = -1.0,
           "(regenerates=True) The next chunk a consumer catching up needs: (lease, epoch, "
           "index), to be produced again and given to publish_private(); None once every "
           "consumer got the stream's end (or after `timeout`, negative: none), or stopped.")
      .def("publish_private", &PyStreamHost::publish_private, py::arg("lease"), py::arg("tensors"),
           py::arg("epoch"), py::arg("index_in_epoch"), py::arg("sample_start"),
           py::arg("epoch_samples"), py::arg("epoch_end"),
           "Copy the regenerated batch into the leased slot and publish it to its consumer.")
      .def("finish", [](PyStreamHost& s) { s.core().finish(); })
      .def(
          "fail", [](PyStreamHost& s, const std::string& message) { s.core().fail(message); },
          py::arg("message"))
      .def("wait_finished", &PyStreamHost::wait_finished, py::arg("timeout") = -1.0)
      .def("stop", &PyStreamHost::stop)
      .def(
          "set_epoch_samples",
          [](PyStreamHost& s, uint64_t samples) { s.core().set_epoch_samples(samples); },
          py::arg("samples"))
      .def("stats", [](PyStreamHost& s) { return stats_dict(s.core().stats()); })
      .def_property_readonly("consumers_now",
                             [](PyStreamHost& s) { return s.core().consumers_now(); })
      .def_property_readonly("consumers_reading",
                             [](PyStreamHost& s) { return s.core().consumers_reading(); })
      .def_property_readonly("consumers_ever",
                             [](PyStreamHost& s) { return s.core().consumers_ever(); })
      .def_property_readonly("endpoint", [](PyStreamHost& s) { return s.core().endpoint(); })
      .def_property_readonly("slot_bytes",
                             [](PyStreamHost& s) { return s.core().memory().pool().slot_bytes(); });

  m.def(
      "chunk_bytes",
      [](const py::list& tensors) { return plan_batch(host_tensors(tensors)).bytes; },
      py::arg("tensors"), "Slot bytes a batch [(name, dtype, shape, data_ptr), ...] needs.");
}

}  // namespace batchcast::python
