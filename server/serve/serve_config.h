// ServeConfig: every setting of `batchcast serve`, and what follows from them.
//
// Each field is declared as an option once, in serve_options.h (name, group, help, rule), and two
// front ends fill the fields from there: the command line (serve_cli.h, which checks each option
// on its own: choices, ranges, existing paths) and Python (_batchcast.ServeConfig, python/src/
// bind_serve.cpp), which builds it directly, with no argument strings. validate() then checks
// the settings against each other, once, and settles what they imply (the GPU of the pool,
// whether it decodes there). The rest of the server reads the settled values through the
// *_options() builders, the one place where settings become the stream host's options (slot bytes
// included).
//
// Thread-safety: a plain value; fill and validate() on one thread, then read it from any.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "decoders/image_pipeline.h"
#include "server/host/stream_host.h"
#include "server/produce/sample_producer.h"
#include "server/produce/view_set.h"
#include "shm/device_identity.h"

namespace batchcast {

enum class DecoderKind { kCpu, kNvjpeg, kMixed };
enum class CacheKind { kOff, kDecoded };

struct ServeConfig {
  // What to serve: exactly one of an image folder, a file list or N synthetic samples.
  std::string data;
  std::string file_list;
  uint64_t synthetic = 0;
  uint64_t sample_bytes = 1024;  // per synthetic sample

  std::string endpoint;  // empty: the per-user default ipc endpoint
  bool listen_all = false;
  uint32_t batch_size = 64;
  // Slots in the pool; 0: as many as ring_memory holds (server/serve/ring_size.h), the producer
  // then running at most kRingLeadChunks ahead of every reader; a GPU pool: kMinRingSlots.
  uint32_t ring = 0;
  uint64_t ring_memory = 0;  // bytes; 0: default_ring_memory() of this host (split between ranks)
  uint32_t workers = std::max(1u, std::thread::hardware_concurrency());
  uint32_t min_consumers = 1;

  // The transform: decoders/image_pipeline.h has each field's meaning and default, decoders/view.h
  // its fields' names and rules. Python builds it as _batchcast.PipelineOptions. Its seed is the stream's too (shuffling and augmentation).
  PipelineOptions transform;
  // Further views served from the first chunk on (docs/views.md): view texts (decoders/view.h)
  // read over `transform`, e.g. "size=160,crop=center". Consumers may add views when they attach
  // (Loader(view=...)); both need an image source in a host pool.
  std::vector<std::string> views;
  OnErrorPolicy on_error = OnErrorPolicy::kRaise;
  // cpu, cuda, cuda:K, or a GPU-<uuid> / MIG-<uuid> (a MIG instance), or several GPUs
  // (cuda:0,cuda:1 or all: the pool on each, shm/arena_set.h): shm/device_identity.h.
  std::string device = "cpu";
  DecoderKind decoder = DecoderKind::kCpu;

  uint64_t epochs = 1;  // 0: until stopped
  bool shuffle = true;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // Every rank's shard from this one process (a node-wide server for DDP jobs): rank r's stream
  // listens on protocol::rank_endpoint(endpoint, r), its pool on the (r mod G)-th GPU of
  // --device, its metrics (if any) in metrics_dir/rank<r>; the workers are split between ranks.
  bool every_rank = false;
  StallPolicy stall_policy = StallPolicy::kDecouple;
  double stall_timeout = kDefaultStallTimeoutS;
  // The order of consumers that leave it to the server (docs/stream.md, "Order"): exact or
  // relaxed; a consumer's Hello may ask for either itself.
  protocol::Order order = protocol::Order::kExact;

  // The decoded cache (docs/views.md, "Decoded cache"; server/produce/decoded_cache.h): off, or
  // decoded (each image kept decoded after its first decode, its shorter side at most cache_side;
  // 0: the largest view's default eval resize, int(image_size * 256 / 224)), in at most
  // cache_memory bytes (0: default_cache_memory() of this host, split between ranks).
  CacheKind cache = CacheKind::kOff;
  uint32_t cache_side = 0;
  uint64_t cache_memory = 0;

  std::string metrics_dir;  // empty: no metrics
  double metrics_interval = 1.0;
  double status_interval = 5.0;  // 0: no status lines
  // After a stream failure: seconds the server keeps answering with the error before it exits.
  double fail_linger = 30.0;

  // The names of the enum settings (the one table each, which serve_options.h hands every front
  // end; the transform's own enums are named in decoders/image_pipeline.h).
  static const std::map<std::string, DecoderKind> kDecoders;
  static const std::map<std::string, OnErrorPolicy> kOnError;
  static inline const std::map<std::string, StallPolicy>& kStallPolicies = kStallPolicyNames;
  static const std::map<std::string, protocol::Order> kOrders;  // exact, relaxed: no "server"
  static const std::map<std::string, CacheKind> kCaches;

  // Checks the options against each other; throws Error naming the options and the fix. With a
  // CUDA device, also checks the GPU exists (fails at once, before any dataset is scanned).
  void validate();

  // After validate(): the GPUs that hold the pool (producers write on the first; nvJPEG decodes
  // there), empty for a pool in host memory.
  const std::vector<int>& cuda_devices() const { return cuda_devices_; }
  bool on_gpu() const { return !cuda_devices_.empty(); }
  bool gpu_decoding() const { return decoder != DecoderKind::kCpu; }
  std::string decoder_flag() const;  // "--decoder <name>", as errors name it

  // How the views of an image stream are made in this pool (server/produce/view_set.h), and the
  // transform as a view (view 0; its seed the stream's).
  ViewSet::Staging staging() const;
  View transform_view() const { return View(transform); }
  // After validate(), with every_rank: one validated config per rank, as described above.
  std::vector<ServeConfig> rank_configs() const;
  // The stream host's options for chunks of `slot_tensors` (view 0's tensors as the pool holds
  // them); `views_bytes`: the slot bytes of the views served from the start, view 0's included,
  // which a ring sized by memory divides the budget by (ring_size.h).
  StreamHostOptions server_options(const std::vector<SampleTensor>& slot_tensors,
                                   uint64_t epoch_samples, uint64_t views_bytes) const;
  SampleProducerOptions producer_options() const;  // without a stage

 private:
  std::vector<int> cuda_devices_;
};

}  // namespace batchcast
