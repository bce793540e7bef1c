#include "server/produce/cuda_stage.h"

#include "common/cuda_check.h"
#include "common/error.h"

namespace batchcast {

std::vector<SampleTensor> CudaStage::converted(const std::vector<SampleTensor>& staged,
                                               const std::vector<TensorConversion>& conversions) {
  std::vector<SampleTensor> out = staged;
  for (size_t t = 0; t < conversions.size() && t < out.size(); ++t) {
    const auto& c = conversions[t];
    if (!c.normalize) continue;
    const auto& s = staged[t];
    if (s.dtype != DType::kUInt8 || s.shape.size() != 3 || s.shape[2] != 3)
      throw Error("tensor '" + s.name +
                  "' cannot be normalised on the GPU: it is not uint8 HWC RGB");
    const DType to = *c.normalize;
    if (to != DType::kFloat32 && to != DType::kFloat16 && to != DType::kBFloat16)
      throw Error("tensor '" + s.name + "' cannot be normalised to " + dtype_name(to) +
                  " on the GPU; use float32, float16 or bfloat16 (uint8 is copied as it is)");
    out[t].shape = {3, s.shape[0], s.shape[1]};
    out[t].dtype = to;
  }
  return out;
}

CudaStage::CudaStage(const ArenaSet& arenas, const SampleSource& source,
                     std::vector<TensorConversion> conversions, uint32_t chunk_size)
    : arenas_(arenas),
      arena_(arenas.primary()),
      source_(source),
      staged_(source.tensors()),
      conversions_(std::move(conversions)),
      slot_tensors_(converted(staged_, conversions_)),
      staged_layout_(SlotLayout::plan(staged_, chunk_size)),
      slot_layout_(SlotLayout::plan(slot_tensors_, chunk_size)),
      chunk_size_(chunk_size) {
  conversions_.resize(staged_.size());
  if (slot_layout_.bytes > arena_.slot_bytes())
    throw Error("a converted chunk needs " + std::to_string(slot_layout_.bytes) +
                " bytes but GPU slots hold " + std::to_string(arena_.slot_bytes()));
  CudaDeviceGuard guard(arena_.device());
  staging_ = PinnedBuffer::allocate(staged_layout_.bytes * arena_.slot_count());
  stream_ = CudaStream::create();
  uint64_t scratch_bytes = 0;
  for (size_t t = 0; t < staged_.size(); ++t) {
    tables_.emplace_back();
    if (!conversions_[t].normalize) continue;
    auto table =
        make_convert_table(*conversions_[t].normalize, conversions_[t].mean, conversions_[t].std);
    tables_.back() = DeviceBuffer::allocate(table.bytes.size());
    cuda_check(cudaMemcpy(tables_.back().data(), table.bytes.data(), table.bytes.size(),
                          cudaMemcpyHostToDevice),
               "copying a normalisation table to cuda:" + std::to_string(arena_.device()));
    scratch_bytes = std::max<uint64_t>(scratch_bytes, staged_[t].bytes() * chunk_size_);
  }
  if (scratch_bytes) scratch_ = DeviceBuffer::allocate(scratch_bytes);
}

CudaStage::~CudaStage() {
  if (stream_.get()) (void)cudaStreamSynchronize(stream_.get());
}

std::vector<SampleTensor> CudaStage::slot_tensors() const { return slot_tensors_; }

void CudaStage::begin(uint32_t slot, uint32_t /*samples*/) {
  // The slot's event was last recorded after its previous upload; once it completed, that
  // upload no longer reads this staging area.
  arenas_.wait_for_slot(slot);
}

void CudaStage::fill(uint32_t slot, uint32_t position, uint64_t index, uint64_t epoch) {
  source_.fill(
      index, epoch,
      staged_layout_.sample_outs(staging_.data() + slot * staged_layout_.bytes, staged_, position));
}

void CudaStage::upload(const FillLease& lease, uint32_t sample_count) {
  CudaDeviceGuard guard(arena_.device());
  const uint8_t* src = staging_.data() + lease.slot * staged_layout_.bytes;
  cudaStream_t s = stream_.get();
  for (size_t t = 0; t < staged_.size(); ++t) {
    const uint8_t* from = src + staged_layout_.offsets[t];
    uint8_t* to = lease.data + slot_layout_.offsets[t];
    uint64_t bytes = staged_[t].bytes() * sample_count;
    const std::string what = "uploading tensor '" + staged_[t].name + "' of chunk " +
                             std::to_string(lease.seq) +
                             " to cuda:" + std::to_string(arena_.device());
    if (!conversions_[t].normalize) {
      cuda_check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, s), what);
      continue;
    }
    cuda_check(cudaMemcpyAsync(scratch_.data(), from, bytes, cudaMemcpyHostToDevice, s), what);
    int element = static_cast<int>(dtype_size(*conversions_[t].normalize));
    launch_hwc_to_chw(scratch_.data(), to, sample_count, static_cast<uint32_t>(staged_[t].shape[0]),
                      static_cast<uint32_t>(staged_[t].shape[1]), tables_[t].data(), element, s);
  }
  cuda_check(cudaEventRecord(arena_.slot_event(lease.slot), s),
             "recording the ready event of slot " + std::to_string(lease.slot));
  arenas_.replicate(lease.slot, slot_layout_.bytes, s);  // to the pool's other GPUs, if any
}

}  // namespace batchcast
