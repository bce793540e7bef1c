#include "server/produce/cuda_stage.h"

#include "common/cuda_check.h"
#include "common/error.h"

namespace batchcast {

CudaStage::CudaStage(const SampleSource& source, ViewOf view_of, uint32_t chunk_size)
    : source_(source), view_of_(std::move(view_of)), chunk_size_(chunk_size) {
  View first = view_of_(0);
  device_ = first.arenas->primary().device();
  CudaDeviceGuard guard(device_);
  stream_ = CudaStream::create();
  add_view(0);
}

CudaStage::~CudaStage() {
  if (stream_.get()) (void)cudaStreamSynchronize(stream_.get());
}

void CudaStage::add_view(uint32_t view) {
  if (view >= views_.size())
    throw Error("a GPU pool stages at most " + std::to_string(views_.size()) + " views");
  View what = view_of_(view);
  auto v = std::make_unique<ViewStage>();
  v->arenas = what.arenas;
  v->staged = source_.view_tensors(view);
  v->conversions = std::move(what.conversions);
  v->slot_tensors = converted(v->staged, v->conversions);
  v->conversions.resize(v->staged.size());
  v->staged_layout = SlotLayout::plan(v->staged, chunk_size_);
  v->slot_layout = SlotLayout::plan(v->slot_tensors, chunk_size_);
  const DeviceArena& arena = v->arenas->primary();
  if (v->slot_layout.bytes > arena.slot_bytes())
    throw Error("a converted chunk of view " + std::to_string(view) + " needs " +
                std::to_string(v->slot_layout.bytes) + " bytes but its GPU slots hold " +
                std::to_string(arena.slot_bytes()));
  CudaDeviceGuard guard(device_);
  v->staging = PinnedBuffer::allocate(v->staged_layout.bytes * arena.slot_count());
  uint64_t scratch_bytes = 0;
  for (size_t t = 0; t < v->staged.size(); ++t) {
    v->tables.emplace_back();
    if (!v->conversions[t].normalize) continue;
    const TensorConversion& c = v->conversions[t];
    auto table = make_convert_table(*c.normalize, c.mean, c.std);
    v->tables.back() = DeviceBuffer::allocate(table.bytes.size());
    cuda_check(cudaMemcpy(v->tables.back().data(), table.bytes.data(), table.bytes.size(),
                          cudaMemcpyHostToDevice),
               "copying a normalisation table to cuda:" + std::to_string(device_));
    scratch_bytes = std::max<uint64_t>(scratch_bytes, v->staged[t].bytes() * chunk_size_);
  }
  if (scratch_bytes) v->scratch = DeviceBuffer::allocate(scratch_bytes);
  views_[view] = std::move(v);
  view_count_.store(view + 1, std::memory_order_release);
}

std::vector<SampleTensor> CudaStage::slot_tensors() const { return views_[0]->slot_tensors; }

void CudaStage::begin(const FillLease& lease, uint32_t /*samples*/) {
  // Views added since the last chunk: this lease is the first to carry them.
  for (uint32_t v = view_count_.load(std::memory_order_relaxed); v < lease.views.size(); ++v)
    add_view(v);
  // A slot's events were last recorded after its previous upload; once that completed, that
  // upload no longer reads this slot's staging areas.
  for (uint32_t v = 0; v < lease.views.size(); ++v)
    if (lease.views[v]) views_[v]->arenas->wait_for_slot(lease.slot);
}

void CudaStage::fill(const FillLease& lease, uint32_t position, uint64_t index, uint64_t epoch) {
  std::vector<std::vector<uint8_t*>> outs(lease.views.size());  // empty: a view not filled
  for (uint32_t k = 0; k < lease.views.size(); ++k) {
    if (!lease.views[k]) continue;
    const ViewStage& v = *views_[k];  // published by begin() before this chunk's fills
    outs[k] = v.staged_layout.sample_outs(v.staging.data() + lease.slot * v.staged_layout.bytes,
                                          v.staged, position);
  }
  source_.fill_views(index, epoch, outs);
}

void CudaStage::upload(const FillLease& lease, uint32_t sample_count) {
  CudaDeviceGuard guard(device_);
  for (uint32_t k = 0; k < lease.views.size(); ++k)
    if (lease.views[k]) upload_view(*views_[k], lease.views[k], lease, sample_count);
}

void CudaStage::upload_view(const ViewStage& v, uint8_t* slot, const FillLease& lease,
                            uint32_t sample_count) {
  const uint8_t* src = v.staging.data() + lease.slot * v.staged_layout.bytes;
  cudaStream_t s = stream_.get();
  for (size_t t = 0; t < v.staged.size(); ++t) {
    const uint8_t* from = src + v.staged_layout.offsets[t];
    uint8_t* to = slot + v.slot_layout.offsets[t];
    uint64_t bytes = v.staged[t].bytes() * sample_count;
    const std::string what = "uploading tensor '" + v.staged[t].name + "' of chunk " +
                             std::to_string(lease.seq) + " to cuda:" + std::to_string(device_);
    if (!v.conversions[t].normalize) {
      cuda_check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, s), what);
      continue;
    }
    cuda_check(cudaMemcpyAsync(v.scratch.data(), from, bytes, cudaMemcpyHostToDevice, s), what);
    int element = static_cast<int>(dtype_size(*v.conversions[t].normalize));
    launch_hwc_to_chw(v.scratch.data(), to, sample_count,
                      static_cast<uint32_t>(v.staged[t].shape[0]),
                      static_cast<uint32_t>(v.staged[t].shape[1]), v.tables[t].data(), element, s);
  }
  cuda_check(cudaEventRecord(v.arenas->primary().slot_event(lease.slot), s),
             "recording the ready event of slot " + std::to_string(lease.slot));
  v.arenas->replicate(lease.slot, v.slot_layout.bytes, s);  // to the pool's other GPUs, if any
}

}  // namespace batchcast
