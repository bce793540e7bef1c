#include "client/host_assembler.h"

#include <algorithm>
#include <cstring>

namespace batchcast {

namespace {

// Bytes of one sample of `t` stored contiguously.
size_t row_bytes(const protocol::TensorSpec& t) {
  size_t n = dtype_size(t.dtype);
  for (size_t i = 1; i < t.shape.size(); ++i) n *= static_cast<size_t>(t.shape[i]);
  return n;
}

// Copies rows [start, start+count) of a strided tensor into contiguous `out`.
void copy_rows(const uint8_t* base, const protocol::TensorSpec& t, uint32_t start, uint32_t count,
               uint8_t* out) {
  size_t item = dtype_size(t.dtype);
  size_t row_elems = 1;
  bool contiguous = true;
  int64_t expect = 1;
  for (size_t i = t.shape.size(); i-- > 1;) {
    if (t.shape[i] != 1 && t.strides[i] != expect) contiguous = false;
    expect *= t.shape[i];
    row_elems *= static_cast<size_t>(t.shape[i]);
  }
  const uint8_t* src = base + t.offset;
  for (uint32_t r = 0; r < count; ++r) {
    const uint8_t* row = src + (start + r) * t.strides[0] * item;
    uint8_t* dst = out + r * row_elems * item;
    if (contiguous) {
      std::memcpy(dst, row, row_elems * item);
      continue;
    }
    for (size_t e = 0; e < row_elems; ++e) {  // general strides: element by element
      size_t rem = e;
      int64_t off = 0;
      for (size_t i = t.shape.size(); i-- > 1;) {
        off += static_cast<int64_t>(rem % t.shape[i]) * t.strides[i];
        rem /= t.shape[i];
      }
      std::memcpy(dst + e * item, row + off * item, item);
    }
  }
}

}  // namespace

void HostAssembler::add(Piece piece) {
  pieces_.push_back(std::move(piece));
  if (pieces_.size() + (first_ ? 1 : 0) >= 2) stage();  // no longer one view: copy as it comes
}

void HostAssembler::stage() {
  for (auto& p : pieces_) {
    const auto& desc = p.chunk->desc;
    if (!first_) {
      first_ = desc;
      for (const auto& t : desc.tensors)
        staged_.push_back(
            std::make_unique<uint8_t[]>(std::max<size_t>(row_bytes(t) * capacity_, 1)));
    }
    check_stackable(*first_, desc, /*contiguous=*/false);
    for (size_t ti = 0; ti < first_->tensors.size(); ++ti)
      copy_rows(p.chunk->base, desc.tensors[ti], p.start, p.count,
                staged_[ti].get() + staged_rows_ * row_bytes(first_->tensors[ti]));
    staged_rows_ += p.count;
  }
  pieces_.clear();
}

void HostAssembler::view(Batch& batch) {
  batch.chunks_.push_back(pieces_.front().chunk);
  batch.tensors = views_in_place(pieces_.front());
  pieces_.clear();
}

void HostAssembler::copy(Batch& batch) {
  stage();
  for (size_t ti = 0; ti < first_->tensors.size(); ++ti) {
    TensorView v = contiguous_view(first_->tensors[ti], batch.size);
    v.data = staged_[ti].get();
    batch.owned_.push_back(std::move(staged_[ti]));
    batch.tensors.push_back(std::move(v));
  }
  discard();
}

void HostAssembler::discard() {
  pieces_.clear();
  first_.reset();
  staged_.clear();
  staged_rows_ = 0;
}

}  // namespace batchcast
