// SampleSource: a dataset the native producer can decode sample by sample, straight into slot
// memory. Implementations: SyntheticSource (bytes derived from the sample index, for tests and
// the transport benchmark) and ImageSource (decoders/ pipeline over an image folder).
//
// Thread-safety: fill() and fill_views() are called concurrently from the producer's worker
// threads, each call writing only its own sample's memory. Ownership: the producer owns its source.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace batchcast {

// One tensor of a sample: dtype and per-sample shape (the batch adds dimension 0).
struct SampleTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  size_t bytes() const {
    size_t n = dtype_size(dtype);
    for (auto d : shape) n *= static_cast<size_t>(d);
    return n;
  }
};

// The wire's name of a sample's tensor `i` ("#0", "#1", ...): a consumer returns tensors so
// named as a tuple in that order (docs/protocol.md). Every source's tensors are such a tuple.
inline std::string tuple_tensor_name(size_t i) { return "#" + std::to_string(i); }

class SampleSource {
 public:
  static constexpr uint32_t kMaxViews = 16;  // the most views a source serves
  virtual ~SampleSource() = default;
  virtual uint64_t size() const = 0;
  virtual std::vector<SampleTensor> tensors() const = 0;
  // Writes sample `index` (augmented for `epoch`) into outs[t] for each tensor t.
  // Throws SampleError naming the file and the reason when the sample is bad.
  virtual void fill(uint64_t index, uint64_t epoch, const std::vector<uint8_t*>& outs) const = 0;
  // Views (ImageSource; docs/views.md): view `view`'s tensors (view 0: tensors()), and every
  // view of a sample at once, outs[v][t] for tensor t of view v (outs.size() views, from one read
  // and decode); an empty outs[v] skips view v (a chunk not made for it), leaving the others'
  // bytes as they are. A source without views has view 0 only: these default to tensors() and
  // fill().
  virtual std::vector<SampleTensor> view_tensors(uint32_t /*view*/) const { return tensors(); }
  virtual void fill_views(uint64_t index, uint64_t epoch,
                          const std::vector<std::vector<uint8_t*>>& outs) const {
    if (!outs[0].empty()) fill(index, epoch, outs[0]);
  }
};

}  // namespace batchcast
