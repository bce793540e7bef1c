#include "server/produce/rule_trial.h"

namespace batchcast {

void RuleTrial::enter(Phase phase, double now) {
  phase_ = phase;
  phase_since_ = now;
  window_start_.reset();
}

namespace {
// A trial begins once the moving average of the calls' `waits` (the newest weighing this much)
// reaches kWaiting: about 16 calls in a row in which consumers wait, from none.
constexpr double kNewest = 0.1;
constexpr double kWaiting = 0.8;
}  // namespace

RuleTrial::Rule RuleTrial::at(double now, uint64_t sent, bool waits) {
  waiting_ += kNewest * ((waits ? 1.0 : 0.0) - waiting_);
  if (phase_ == Phase::kKeep && now - phase_since_ >= timing_.keep_s) enter(Phase::kReady, now);
  if (phase_ == Phase::kKeep) return kept_;
  if (phase_ == Phase::kReady) {
    if (waiting_ < kWaiting && kept_ == Rule::kDefault) return kept_;
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
  if (lasted > 2 * timing_.window_s) {  // nothing was chosen for a while: no measure of `trying`
    enter(Phase::kReady, now);
    return kept_;
  }
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
