// RuleTrial: which of two rules a producer follows, chosen by what its consumers read under each.
//
// Why: a rule derived from measured rates (server/produce/decode_split.h) assumes that the ways of
// decoding it mixes do not slow each other. On few cores, or a GPU time-sliced with trainers,
// they can, and only the consumers' intake says which rule serves them better. So the trial runs
// the default rule and the alternative in turn, each for a window after a settling time, compares
// the samples consumers were sent per second in each, follows the better one (the default unless
// the alternative is more than `margin` ahead) for `keep_s`, then tries both again: trainers come
// and go, and the better rule with them.
//
// While the default is followed, a trial begins only while consumers wait for data (most of the
// recent calls said so): while they do not, the rules differ little and what consumers are sent
// says nothing of them (trainers warming up, a stream the CPU keeps up with). The alternative,
// once kept, is tried against the default again after keep_s whether they wait or not: consumers
// that no longer wait may be served as well by the default, which then wins the tie. A window
// is as long as the calls make it: it ends at the first call `window_s` after it began, and its
// rate is measured over the time it really lasted; one that lasted over twice `window_s` (the
// readers left and nothing was chosen meanwhile) says nothing of its rule, and the trial is given
// up until consumers wait again. What consumers are sent also moves with how many read: a trainer
// that joins or leaves between the two windows tilts one comparison, which the next trial redoes.
//
// Thread-safety: none; the owner serialises the calls (DecodeSplit calls under its mutex).
// Ownership: a value type with no resources, owned by its DecodeSplit.
#pragma once

#include <cstdint>
#include <optional>

namespace batchcast {

class RuleTrial {
 public:
  enum class Rule : uint8_t { kDefault, kAlternative };
  struct Timing {
    double settle_s = 0.5;  // after a switch, before its window: chunks of the other rule drain
    double window_s = 1.0;  // each rule's measured window
    double keep_s = 15.0;   // the better rule followed this long before the next trial
    double margin = 0.03;   // the alternative wins only if this much ahead
  };

  explicit RuleTrial(Timing timing) : timing_(timing) {}
  RuleTrial() : RuleTrial(Timing{}) {}

  // The rule to follow now: `now` in seconds (monotonic), `sent` the samples sent to consumers
  // so far (a counter that only grows), `waits` whether a consumer waits for data now.
  Rule at(double now, uint64_t sent, bool waits);

  // Samples/s consumers were sent in each rule's last window; nullopt before its first.
  std::optional<double> rate(Rule rule) const {
    return rule == Rule::kDefault ? default_rate_ : alternative_rate_;
  }
  Rule kept() const { return kept_; }  // the rule the last comparison chose
  uint32_t trials() const { return trials_; }  // comparisons made

 private:
  enum class Phase : uint8_t { kReady, kTryDefault, kTryAlternative, kKeep };
  void enter(Phase phase, double now);

  const Timing timing_;
  Phase phase_ = Phase::kReady;  // for a trial, once consumers wait
  double phase_since_ = 0;
  double waiting_ = 0;  // moving average of the calls' `waits`
  std::optional<double> window_start_;
  uint64_t window_sent_ = 0;
  std::optional<double> default_rate_, alternative_rate_;
  Rule kept_ = Rule::kDefault;
  uint32_t trials_ = 0;
};

}  // namespace batchcast
