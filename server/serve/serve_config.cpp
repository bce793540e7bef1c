#include "server/serve/serve_config.h"

#include <algorithm>

#include "common/error.h"
#include "common/named.h"
#include "protocol/endpoint.h"
#include "protocol/messages.h"
#include "server/serve/ring_size.h"
#ifdef BATCHCAST_HAVE_CUDA
#include "shm/cuda_pool.h"
#endif

namespace batchcast {

const std::map<std::string, DecoderKind> ServeConfig::kDecoders = {
    {"cpu", DecoderKind::kCpu}, {"nvjpeg", DecoderKind::kNvjpeg}, {"mixed", DecoderKind::kMixed}};
const std::map<std::string, OnErrorPolicy> ServeConfig::kOnError = {
    {"raise", OnErrorPolicy::kRaise}, {"skip", OnErrorPolicy::kSkip}};
const std::map<std::string, protocol::Order> ServeConfig::kOrders = {
    {"exact", protocol::Order::kExact}, {"relaxed", protocol::Order::kRelaxed}};
const std::map<std::string, CacheKind> ServeConfig::kCaches = {{"off", CacheKind::kOff},
                                                              {"decoded", CacheKind::kDecoded}};
std::string ServeConfig::decoder_flag() const {
  return "--decoder " + name_of(decoder, kDecoders).value_or("?");
}

void ServeConfig::validate() {
  if ((synthetic > 0) + !data.empty() + !file_list.empty() != 1)
    throw Error("give exactly one of --data DIR, --file-list FILE or --synthetic N");
  if (every_rank && rank != 0)
    throw Error(
        "--every-rank serves every rank of --world-size: drop --rank (and RANK from the "
        "environment)");
  if (rank >= world_size)
    throw Error("--rank " + std::to_string(rank) + " must be below --world-size " +
                std::to_string(world_size) +
                " (ranks count from 0): lower --rank or raise --world-size");
  if (!name_of(order, kOrders))
    throw Error("--order: the server's default order is exact or relaxed (a consumer leaves its "
                "order to the server, never the server to itself)");
  if (cache == CacheKind::kDecoded && synthetic)
    throw Error("--cache decoded keeps decoded images; --synthetic has none: drop --cache");
  const PipelineOptions& t = transform;
  if (t.scale[0] > t.scale[1] || t.ratio[0] > t.ratio[1])
    throw Error("--scale and --ratio are MIN,MAX ranges: give the smaller value first");
  if (!t.train && t.resize_size != 0 && t.resize_size < t.image_size)
    throw Error("--resize-size " + std::to_string(t.resize_size) + " is below --image-size " +
                std::to_string(t.image_size) +
                ": the centred crop must fit the resized image; raise --resize-size");
  const auto devices = parse_device_list(device);
  if (!devices) throw Error("--device " + device_list_error(device));
  const bool on_gpu = devices->all || devices->devices.front().kind != DeviceSpec::Kind::kCpu;
  if (!views.empty()) {
    if (synthetic) throw Error("--view makes images; --synthetic has none: drop --view");
    for (const auto& text : views)  // names the bad field
      ViewSet::decodable(text, transform_view(),
                         gpu_decoding() ? ViewSet::Staging::kGpuDecode : ViewSet::Staging::kHost,
                         decoder_flag());
  }
  if (gpu_decoding()) {
    const std::string flag = decoder_flag();
    if (t.interpolation != Interpolation::kBilinear)
      throw Error(flag + " resizes bilinearly: drop --interpolation or use --decoder cpu");
    if (synthetic) throw Error(flag + " decodes images; --synthetic has none: drop " + flag);
    if (!on_gpu) throw Error(flag + " decodes into a GPU pool: add --device cuda:K");
#ifndef BATCHCAST_HAVE_NVJPEG
    throw Error(flag +
                ": this build has no nvJPEG (its CUDA toolkit lacks nvjpeg.h); rebuild where the "
                "toolkit has it, or use --decoder cpu");
#endif
  }
#ifdef BATCHCAST_HAVE_CUDA
  cuda_devices_.clear();
  if (devices->all) {
    for (const auto& v : visible_cuda_devices()) cuda_devices_.push_back(v.index);
    if (cuda_devices_.empty())
      throw Error(
          "--device all: no CUDA device is usable here (no GPU or no driver); use "
          "--device cpu");
  } else if (on_gpu) {
    for (const auto& spec : devices->devices) {  // fails at once without that GPU
      const int index = require_cuda_device(spec);
      if (std::find(cuda_devices_.begin(), cuda_devices_.end(), index) != cuda_devices_.end())
        throw Error("--device " + device + " names cuda:" + std::to_string(index) +
                    " twice; list each GPU once");
      cuda_devices_.push_back(index);
    }
  }
#else
  if (on_gpu)
    throw Error("--device " + device + ": this build has no CUDA support; use --device cpu");
#endif
}

ViewSet::Staging ServeConfig::staging() const {
  if (gpu_decoding()) return ViewSet::Staging::kGpuDecode;
  return on_gpu() ? ViewSet::Staging::kGpuConvert : ViewSet::Staging::kHost;
}

std::vector<ServeConfig> ServeConfig::rank_configs() const {
  std::vector<ServeConfig> out;
  const std::string base = endpoint.empty() ? protocol::default_endpoint() : endpoint;
  const HostMemory host = read_host_memory();
  const uint64_t rank_ring_memory = default_ring_memory(host) / world_size;
  const uint64_t rank_cache_memory = default_cache_memory(host) / world_size;
  for (uint32_t r = 0; r < world_size; ++r) {
    ServeConfig c = *this;
    c.every_rank = false;
    c.rank = r;
    c.endpoint = protocol::rank_endpoint(base, r);
    c.workers = std::max(1u, workers / world_size);
    if (!ring && !ring_memory) c.ring_memory = rank_ring_memory;
    if (cache == CacheKind::kDecoded && !cache_memory) c.cache_memory = rank_cache_memory;
    if (!metrics_dir.empty()) c.metrics_dir = metrics_dir + "/rank" + std::to_string(r);
    if (!cuda_devices_.empty())
      c.device = "cuda:" + std::to_string(cuda_devices_[r % cuda_devices_.size()]);
    c.validate();
    out.push_back(std::move(c));
  }
  return out;
}

StreamHostOptions ServeConfig::server_options(const std::vector<SampleTensor>& slot_tensors,
                                              uint64_t epoch_samples,
                                              uint64_t views_bytes) const {
  StreamHostOptions so;
  so.endpoint = endpoint;
  so.allow_remote = listen_all;
  so.cuda_devices = cuda_devices_;
  so.slot_bytes = SlotLayout::plan(slot_tensors, batch_size).bytes;
  if (ring) {
    so.ring_slots = ring;
  } else if (on_gpu()) {
    so.ring_slots = kMinRingSlots;
  } else {
    const uint64_t budget = ring_memory ? ring_memory : default_ring_memory(read_host_memory());
    so.ring_budget = budget;  // views added later shrink the ring to keep within it
    so.min_ring_slots = kMinRingSlots;
    so.ring_slots = ring_slots_for(budget, std::max(views_bytes, so.slot_bytes),
                                   (epoch_samples + batch_size - 1) / batch_size);
    so.lead_chunks = std::min(kRingLeadChunks, so.ring_slots);
  }
  so.chunk_size = batch_size;
  so.epoch_samples = epoch_samples;
  so.epochs = epochs;
  so.min_consumers = min_consumers;
  so.stall_policy = stall_policy;
  so.stall_timeout_s = stall_timeout;
  so.default_order = order;
  so.regenerates = true;  // SampleProducer: a chunk is a function of (seed, epoch, index)
  return so;
}

SampleProducerOptions ServeConfig::producer_options() const {
  SampleProducerOptions po;
  po.chunk_size = batch_size;
  po.workers = workers;
  po.epochs = epochs;
  po.on_error = on_error;
  return po;
}

}  // namespace batchcast
