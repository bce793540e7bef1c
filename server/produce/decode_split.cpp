#include "server/produce/decode_split.h"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>  // fmt, as spdlog carries it

namespace batchcast {
namespace {

// Weight of the newest measurement in a side's moving average: rates change with the GPU's
// load (trainers starting, MPS or time-slicing) within seconds, and a sample or a chunk alone is
// noisy.
constexpr double kNewest = 0.1;

void average_in(std::optional<double>& average, double value) {
  average = average ? *average + kNewest * (value - *average) : value;
}

}  // namespace

DecodeSplit::DecodeSplit(Stream stream, uint32_t slots, uint32_t workers, RuleTrial::Timing trial)
    : stream_(std::move(stream)),
      workers_(std::max<uint32_t>(workers, 1)),
      side_(slots),
      trial_(trial) {}

void DecodeSplit::begin(uint32_t slot) {
  std::lock_guard lk(mu_);
  side_.at(slot) = Side::kUnchosen;
}

uint32_t DecodeSplit::depth_by_rates_locked() const {
  if (!cpu_s_ || !engine_s_ || *engine_s_ <= 0) return 1;
  const double while_one_cpu_chunk = *cpu_s_ / (workers_ * *engine_s_);
  const double depth = 1 + std::ceil(while_one_cpu_chunk);
  return static_cast<uint32_t>(std::clamp<double>(depth, 1, static_cast<double>(side_.size())));
}

bool DecodeSplit::cpu_decodes(uint32_t slot) {
  const bool waits = stream_.waited().has_value();  // outside the lock: the host's atomic
  std::lock_guard lk(mu_);
  Side& side = side_.at(slot);
  if (side == Side::kUnchosen) {
    rule_ = trial_.at(stream_.now(), stream_.samples_sent(), waits);
    const bool by_rates = rule_ == RuleTrial::Rule::kDefault;
    side = !by_rates || (waits && engine_chunks_ < depth_by_rates_locked()) ? Side::kEngine
                                                                            : Side::kCpu;
    if (side == Side::kEngine) ++engine_chunks_;
  }
  const bool cpu = side == Side::kCpu;
  ++(cpu ? cpu_samples_ : engine_samples_);
  return cpu;
}

void DecodeSplit::cpu_sample_done(double seconds) {
  std::lock_guard lk(mu_);
  average_in(cpu_s_, seconds);
}

void DecodeSplit::uploaded(uint32_t slot, uint32_t samples, double seconds) {
  std::lock_guard lk(mu_);
  Side& side = side_.at(slot);
  if (side != Side::kEngine) return;
  side = Side::kUnchosen;
  --engine_chunks_;
  if (samples) average_in(engine_s_, seconds / samples);
}

uint32_t DecodeSplit::engine_depth() const {
  std::lock_guard lk(mu_);
  return depth_by_rates_locked();
}

std::string DecodeSplit::describe() const {
  std::lock_guard lk(mu_);
  const auto ms = [](std::optional<double> s) {
    return s ? fmt::format("{:.3f} ms", *s * 1e3) : std::string("not measured");
  };
  const auto rate = [&](RuleTrial::Rule rule) {
    const auto r = trial_.rate(rule);
    return r ? fmt::format("{:.0f}", *r) : std::string("-");
  };
  return fmt::format(
      "{} samples decoded on the CPU, {} on the GPU's JPEG decoder ({} a sample on a worker, {} "
      "on the engine; by rates the engine's depth {} chunks; followed {} after {} trial(s): "
      "consumers sent {} samples/s by rates, {} with every chunk on the engine)",
      cpu_samples_, engine_samples_, ms(cpu_s_), ms(engine_s_), depth_by_rates_locked(),
      rule_ == RuleTrial::Rule::kDefault ? "the split by rates" : "every chunk on the engine",
      trial_.trials(), rate(RuleTrial::Rule::kDefault), rate(RuleTrial::Rule::kAlternative));
}

bool DecodeSplit::by_rates() const {
  std::lock_guard lk(mu_);
  return rule_ == RuleTrial::Rule::kDefault;
}

uint64_t DecodeSplit::cpu_samples() const {
  std::lock_guard lk(mu_);
  return cpu_samples_;
}

uint64_t DecodeSplit::engine_samples() const {
  std::lock_guard lk(mu_);
  return engine_samples_;
}

}  // namespace batchcast
