// cuda_check: a failed CUDA runtime call as a batchcast::Error naming the call. Used wherever
// batchcast calls CUDA (the GPU pool, the server's GPU stages, the consumer's GPU assembly, the
// GPU tests and benches), so it lives here rather than with any one of them. CUDA builds only.
// Thread-safety: none needed (it clears the calling thread's sticky CUDA error and throws).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/error.h"

namespace batchcast {

// Throws Error("<what>: <CUDA's message> (<error name>)") unless `status` is cudaSuccess.
inline void cuda_check(cudaError_t status, const std::string& what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  throw Error(what + ": " + cudaGetErrorString(status) + " (" + cudaGetErrorName(status) + ")");
}

}  // namespace batchcast
