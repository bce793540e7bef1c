#include "server/produce/rule_trial.h"

namespace batchcast {

void RuleTrial::enter(Phase phase, double now) {
  phase_ = phase;
  phase_since_ = now;
  window_start_.reset();
}

RuleTrial::Rule RuleTrial::at(double now, uint64_t sent) {
  if (phase_since_ < 0) enter(Phase::kTryDefault, now);
  if (phase_ == Phase::kKeep) {
    if (now - phase_since_ < timing_.keep_s) return kept_;
    enter(Phase::kTryDefault, now);
  }
  const Rule trying = phase_ == Phase::kTryDefault ? Rule::kDefault : Rule::kAlternative;
  if (!window_start_) {
    if (now - phase_since_ >= timing_.settle_s) {
      window_start_ = now;
      window_sent_ = sent;
    }
    return trying;
  }
  const double lasted = now - *window_start_;
  if (lasted < timing_.window_s) return trying;
  const double rate = static_cast<double>(sent - window_sent_) / lasted;
  if (trying == Rule::kDefault) {
    default_rate_ = rate;
    enter(Phase::kTryAlternative, now);
    return Rule::kAlternative;
  }
  alternative_rate_ = rate;
  ++trials_;
  kept_ = rate > *default_rate_ * (1 + timing_.margin) ? Rule::kAlternative : Rule::kDefault;
  enter(Phase::kKeep, now);
  return kept_;
}

}  // namespace batchcast
