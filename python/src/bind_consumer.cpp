// Python bindings of the consumer library (client/consumer.h), SPDL style: thin, GIL released
// around everything that blocks, tensors handed out through DLPack.
//
// - ConsumerOptions: client/consumer.h's options as a typed class (SettingsClass).
// - Consumer(options): construction (handshake), next() and close() release the GIL; next() runs
//   on a BlockingWorker so Ctrl-C interrupts it within ~50 ms without losing the batch being built.
// - Batch: capsules() gives one "dltensor" PyCapsule (legacy DLPack 0.6 DLManagedTensor) per
//   tensor; tensors() gives objects with __dlpack__/__dlpack_device__ (numpy.from_dlpack).
//   Every DLManagedTensor owns a shared_ptr<Batch>, so the shared-memory slot is released
//   exactly when the framework frees the last tensor of the batch. The deleter never touches
//   Python, so frameworks may call it from any thread, with or without the GIL.
// - bool tensors travel as uint8 (DLPack 0.6 has no bool code); Batch.dtypes says "bool" and
//   the Python layer reinterprets them.
#include <dlpack/dlpack.h>
#include <pybind11/stl.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

#include "client/consumer.h"
#include "common/error.h"
#include "python/src/bindings.h"
#include "python/src/blocking_call.h"
#include "python/src/settings_class.h"

namespace py = pybind11;

namespace batchcast::python {
namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::kUInt8:
    case DType::kBool:
      return {kDLUInt, 8, 1};
    case DType::kInt8:
      return {kDLInt, 8, 1};
    case DType::kInt16:
      return {kDLInt, 16, 1};
    case DType::kInt32:
      return {kDLInt, 32, 1};
    case DType::kInt64:
      return {kDLInt, 64, 1};
    case DType::kFloat16:
      return {kDLFloat, 16, 1};
    case DType::kBFloat16:
      return {kDLBfloat, 16, 1};
    case DType::kFloat32:
      return {kDLFloat, 32, 1};
    case DType::kFloat64:
      return {kDLFloat, 64, 1};
  }
  throw Error("tensor has an unknown dtype");
}

DLDevice dl_device(const TensorView& v) {
  if (v.device == protocol::DeviceKind::kCuda)
    return {kDLCUDA, static_cast<int32_t>(v.device_index)};
  return {kDLCPU, 0};
}

// Owns what a DLManagedTensor points at, including the batch that keeps the slot alive.
struct ManagedContext {
  std::shared_ptr<Batch> batch;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor managed{};
};

DLManagedTensor* new_managed(const std::shared_ptr<Batch>& batch, size_t index) {
  const TensorView& v = batch->tensors.at(index);
  auto* ctx = new ManagedContext{batch, v.shape, v.strides, {}};
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = v.data;
  t.device = dl_device(v);
  t.ndim = static_cast<int32_t>(ctx->shape.size());
  t.dtype = dl_dtype(v.dtype);
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = [](DLManagedTensor* m) {
    delete static_cast<ManagedContext*>(m->manager_ctx);
  };
  return &ctx->managed;
}

// Runs when the capsule object dies (GIL held). A consumer that took the tensor renamed the
// capsule "used_dltensor" and now owns it: nothing to do. Otherwise nobody took it and we
// free it; the current Python error, if any, is preserved around the capsule API calls.
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kUsedCapsuleName)) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (m) {
    if (m->deleter) m->deleter(m);
  } else {
    PyErr_WriteUnraisable(capsule);
  }
  PyErr_Restore(type, value, traceback);
}

py::capsule new_capsule(const std::shared_ptr<Batch>& batch, size_t index) {
  DLManagedTensor* m = new_managed(batch, index);
  PyObject* capsule = PyCapsule_New(m, kCapsuleName, capsule_destructor);
  if (!capsule) {
    m->deleter(m);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

// One tensor of a batch as a DLPack producer object (numpy.from_dlpack, cupy, jax).
struct DLPackTensor {
  std::shared_ptr<Batch> batch;
  size_t index;
  const TensorView& view() const { return batch->tensors.at(index); }
};

// What a consumer says about itself, refreshed after every next(): Python may read it while
// an interrupted next() still runs on the worker.
struct Snapshot {
  uint64_t epoch = 0;
  std::pair<uint64_t, uint64_t> position;
  bool finished = false;
  std::optional<uint64_t> batches_per_epoch;
  ConsumerStats stats;
  uint32_t batch_size = 0;
  uint32_t chunk_size = 0;
  uint64_t epoch_samples = 0;
  uint64_t epochs = 0;
  protocol::Order order = protocol::Order::kExact;
};

// A bitset's bytes (bit i of byte k: bit 8k + i) as 64-bit words (bit i of word k: bit 64k + i).
std::vector<uint64_t> bitset_words(const py::bytes& bytes) {
  const std::string_view b = bytes;
  std::vector<uint64_t> words((b.size() + 7) / 8, 0);
  for (size_t i = 0; i < b.size(); ++i)
    words[i / 8] |= uint64_t{static_cast<uint8_t>(b[i])} << (8 * (i % 8));
  return words;
}

struct ConsumerState {
  std::unique_ptr<Consumer> consumer;
  std::shared_ptr<Batch> result;
  mutable std::mutex mu;
  Snapshot snapshot;
  void refresh() {
    Snapshot s;
    s.epoch = consumer->epoch();
    s.position = consumer->position();
    s.finished = consumer->finished();
    s.batches_per_epoch = consumer->batches_per_epoch();
    std::lock_guard lk(mu);
    // The consumer knows an epoch length learnt from chunks only while it holds one; the
    // length does not change, so keep the last one known.
    if (!s.batches_per_epoch) s.batches_per_epoch = snapshot.batches_per_epoch;
    s.stats = consumer->stats();
    s.batch_size = consumer->batch_size();
    s.chunk_size = consumer->welcome().chunk_size;
    s.epoch_samples = consumer->welcome().epoch_samples;
    s.epochs = consumer->welcome().epochs;
    s.order = consumer->order();
    snapshot = s;
  }
};

class PyConsumer {
 public:
  // `owned`: cleared when this object goes, so that a next() still in flight on the detached
  // worker no longer calls into Python (options.on_waiting checks it).
  PyConsumer(ConsumerOptions options, std::shared_ptr<std::atomic<bool>> owned)
      : state_(std::make_shared<ConsumerState>()), owned_(std::move(owned)) {
    py::gil_scoped_release nogil;
    state_->consumer = std::make_unique<Consumer>(std::move(options));
    state_->refresh();
  }
  ~PyConsumer() {
    *owned_ = false;
    if (!worker_.in_flight()) close();
    // else: the detached worker's job owns state_ and destroys the Consumer when it returns.
  }

  std::shared_ptr<Batch> next() {
    if (closed_) throw Error("the consumer is closed; create a new Loader to read again");
    worker_.run([s = state_] {
      s->result = s->consumer->next();
      s->refresh();
    });
    return std::move(state_->result);
  }

  void seek(uint64_t epoch, uint64_t sample, const py::bytes& had) {
    if (closed_) throw Error("the consumer is closed; create a new Loader to read again");
    if (worker_.in_flight())
      throw Error("cannot seek while an interrupted next() still runs; call next() again first");
    state_->consumer->seek(epoch, sample, bitset_words(had));
    state_->refresh();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    if (worker_.in_flight()) return;  // the interrupted next() owns the Consumer until it ends
    py::gil_scoped_release nogil;
    state_->consumer->close();
  }

  Snapshot snapshot() const {
    std::lock_guard lk(state_->mu);
    return state_->snapshot;
  }
  bool closed() const { return closed_; }

 private:
  std::shared_ptr<ConsumerState> state_;
  BlockingWorker worker_;
  std::shared_ptr<std::atomic<bool>> owned_;
  bool closed_ = false;
};

py::dict stats_dict(const ConsumerStats& s) {
  py::dict d;
  d["batches"] = s.batches;
  d["samples"] = s.samples;
  d["skipped"] = s.skipped;
  d["copies"] = s.copies;
  d["wait_s"] = s.wait_s;
  d["dropped_messages"] = s.dropped_messages;
  return d;
}

// Python's names of a consumer's late_join.
const std::map<std::string, protocol::LateJoin> kLateJoinNames = {
    {"replay", protocol::LateJoin::kReplay}, {"next_epoch", protocol::LateJoin::kNextEpoch}};

// Python's names of a consumer's order ("server": the server's default, serve --order).
const std::map<std::string, protocol::Order> kOrderNames = {{"server", protocol::Order::kServer},
                                                            {"exact", protocol::Order::kExact},
                                                            {"relaxed", protocol::Order::kRelaxed}};

// The consumer's options as a typed class (client/consumer.h has each field's meaning); the
// C++ names' unit suffixes are left out, as in ServeConfig. on_waiting is the binding's own.
void bind_consumer_options(py::module_& m) {
  SettingsClass<ConsumerOptions>(
      m, "ConsumerOptions",
      "A Consumer's settings (client/consumer.h). Keyword construction; fields left out keep "
      "their defaults.",
      FieldNames::kKeywords)
      .field("endpoint", &ConsumerOptions::endpoint, "'' : the per-user default ipc endpoint")
      .field("batch_size", &ConsumerOptions::batch_size, "samples per batch; 0: the server's")
      .field("drop_last", &ConsumerOptions::drop_last, "drop each epoch's short last batch")
      .field("timeout", &ConsumerOptions::timeout_s,
             "seconds to wait for the welcome or for data; <= 0: as long as the server lives")
      .field("prefetch", &ConsumerOptions::prefetch, "chunk descriptors asked for ahead")
      .field("max_held", &ConsumerOptions::max_held,
             "zero-copy batches alive at once before further ones are private copies")
      .named("late_join", &ConsumerOptions::late_join, kLateJoinNames,
             "'replay' the retained chunks or wait for the 'next_epoch'")
      .field("name", &ConsumerOptions::name, "shown in the server's log and metrics")
      .field("cuda_device", &ConsumerOptions::cuda_device,
             "GPU pools: the CUDA device it computes on; -1: the current one, else the pool's")
      .field("pin_memory", &ConsumerOptions::pin_memory,
             "host pools: page-lock the mapping for asynchronous copies to the GPU")
      .field("stall_timeout", &ConsumerOptions::stall_timeout_s,
             "seconds it may hold the stream back; 0: the server's stall_timeout")
      .field("view", &ConsumerOptions::view, "the view text it reads; '': the server's own")
      .named("order", &ConsumerOptions::order, kOrderNames,
             "'exact', 'relaxed' (each epoch its shard once, in the server's choice of order), or "
             "'server': the server's default (serve --order)")
      .finish();
}

}  // namespace

void bind_consumer(py::module_& m) {
  bind_consumer_options(m);
  py::class_<DLPackTensor>(m, "DLPackTensor",
                           "One tensor of a batch as a DLPack producer: pass it to "
                           "numpy.from_dlpack, torch.from_dlpack, cupy.from_dlpack, ...")
      .def_property_readonly("name", [](const DLPackTensor& t) { return t.view().name; })
      .def_property_readonly("dtype",
                             [](const DLPackTensor& t) { return dtype_name(t.view().dtype); })
      .def_property_readonly(
          "shape", [](const DLPackTensor& t) { return py::tuple(py::cast(t.view().shape)); })
      .def(
          "__dlpack__",
          [](const DLPackTensor& t, const py::object& stream, const py::kwargs&) {
            // CUDA batches (DLPack stream protocol): None or 1 = the legacy default stream,
            // 2 = per-thread default, -1 = the consumer synchronises itself, else a
            // cudaStream_t. That stream waits for the server's event before reading, and the
            // slot is released only once it has finished with the batch. No-op for host memory.
            int64_t s = stream.is_none() ? 1 : stream.cast<int64_t>();
            if (s != -1) t.batch->use_on_stream(static_cast<uintptr_t>(s));
            return new_capsule(t.batch, t.index);
          },
          py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const DLPackTensor& t) {
        DLDevice d = dl_device(t.view());
        return py::make_tuple(static_cast<int>(d.device_type), d.device_id);
      });

  py::class_<Batch, std::shared_ptr<Batch>>(m, "Batch",
                                            "A batch of tensors viewing (or copied from) the "
                                            "shared pool; its slot is released when every "
                                            "tensor taken from it is freed.")
      .def_readonly("epoch", &Batch::epoch)
      .def_readonly("sample_start", &Batch::sample_start)
      .def_readonly("size", &Batch::size)
      .def_readonly("samples", &Batch::samples,
                    "Relaxed order: the dataset index of each sample (a list); empty in exact "
                    "order.")
      .def_readonly("copied", &Batch::copied,
                    "Private memory, no view of a shared slot: a batch spanning chunks, one "
                    "beyond max_held, or one of a chunk regenerated for this consumer alone.")
      .def_readonly("pinned", &Batch::pinned,
                    "A host view of page-locked memory (Consumer pin_memory): copy it to the "
                    "GPU with non_blocking=True on the stream given to capsules().")
      .def_property_readonly(
          "cuda_device",
          [](const Batch& b) {
            return !b.tensors.empty() && b.tensors[0].device == protocol::DeviceKind::kCuda
                       ? static_cast<int>(b.tensors[0].device_index)
                       : -1;
          },
          "The CUDA device the batch lives on, -1 for host memory.")
      .def_property_readonly("names",
                             [](const Batch& b) {
                               py::tuple names(b.tensors.size());
                               for (size_t i = 0; i < b.tensors.size(); ++i)
                                 names[i] = py::str(b.tensors[i].name);
                               return names;
                             })
      .def_property_readonly("dtypes",
                             [](const Batch& b) {
                               py::tuple dtypes(b.tensors.size());
                               for (size_t i = 0; i < b.tensors.size(); ++i)
                                 dtypes[i] = py::str(dtype_name(b.tensors[i].dtype));
                               return dtypes;
                             })
      .def(
          "capsules",
          [](const std::shared_ptr<Batch>& b, uintptr_t stream) {
            b->use_on_stream(stream);  // CUDA batches: see __dlpack__; no-op for host memory
            py::list out(b->tensors.size());
            for (size_t i = 0; i < b->tensors.size(); ++i) out[i] = new_capsule(b, i);
            return out;
          },
          py::arg("stream") = 0,
          "One 'dltensor' PyCapsule per tensor (for torch.utils.dlpack.from_dlpack). CUDA "
          "batches: `stream` (a cudaStream_t as int, 0 = legacy default, e.g. "
          "torch.cuda.current_stream().cuda_stream) waits for the server's writes, and the slot "
          "is released once it has finished with the tensors. Pinned host batches: the slot is "
          "released once that stream has finished with them (the asynchronous copy).")
      .def(
          "tensors",
          [](const std::shared_ptr<Batch>& b) {
            py::list out(b->tensors.size());
            for (size_t i = 0; i < b->tensors.size(); ++i) out[i] = py::cast(DLPackTensor{b, i});
            return out;
          },
          "One DLPack producer object per tensor (numpy.from_dlpack and friends).")
      .def("__len__", [](const Batch& b) { return b.size; });

  py::class_<PyConsumer>(m, "Consumer", "Native consumer; use batchcast.Loader instead.")
      .def(py::init([](ConsumerOptions o) {
             // At WARNING: Python's default logging shows it (nothing waits in silence).
             auto owned = std::make_shared<std::atomic<bool>>(true);
             o.on_waiting = [owned](const std::string& what, double) {
               if (!*owned || !Py_IsInitialized()) return spdlog::warn("{}", what);
               py::gil_scoped_acquire gil;  // the handshake and next() run with the GIL released
               py::module_::import("logging")
                   .attr("getLogger")("batchcast")
                   .attr("warning")("%s", what);
             };
             return std::make_unique<PyConsumer>(std::move(o), std::move(owned));
           }),
           py::arg("options"),
           "Attaches to the server of options.endpoint (handshake with the GIL released).")
      .def("next", &PyConsumer::next,
           "The next batch of the current epoch, or None at its end (and forever after the "
           "stream's end).")
      .def("seek", &PyConsumer::seek, py::arg("epoch"), py::arg("sample") = 0,
           py::arg("had") = py::bytes(),
           "Start the next iteration at sample `sample` of epoch `epoch` (what was in flight "
           "is released unread). Leaving an epoch early: seek(position[0] + 1, 0). A position "
           "the server cannot serve raises PositionUnavailableError from the next next(). "
           "Relaxed order: `had` is the set of samples had in that epoch, `sample` of them (a "
           "bitset over dataset indices: bit i of byte k is index 8k + i), after which it "
           "resumes.")
      .def_property_readonly(
          "position", [](const PyConsumer& c) { return c.snapshot().position; },
          "(epoch, sample in epoch) of the next sample next() yields; a pending seek's target.")
      .def("close", &PyConsumer::close)
      .def_property_readonly("closed", &PyConsumer::closed)
      .def_property_readonly("epoch", [](const PyConsumer& c) { return c.snapshot().epoch; })
      .def_property_readonly("finished", [](const PyConsumer& c) { return c.snapshot().finished; })
      .def_property_readonly("batches_per_epoch",
                             [](const PyConsumer& c) { return c.snapshot().batches_per_epoch; })
      .def_property_readonly("batch_size",
                             [](const PyConsumer& c) { return c.snapshot().batch_size; })
      .def_property_readonly("chunk_size",
                             [](const PyConsumer& c) { return c.snapshot().chunk_size; })
      .def_property_readonly("epochs", [](const PyConsumer& c) { return c.snapshot().epochs; })
      .def_property_readonly(
          "order",
          [](const PyConsumer& c) {
            return c.snapshot().order == protocol::Order::kRelaxed ? "relaxed" : "exact";
          },
          "The order the server serves this consumer in: 'exact' or 'relaxed'.")
      .def("stats", [](const PyConsumer& c) { return stats_dict(c.snapshot().stats); });
}

}  // namespace batchcast::python
