// server/produce/rule_trial.h: once consumers wait for data, the default rule and the alternative
// each get a window after a settling time; the one that sent consumers more samples per second is
// followed for keep_s (the default on a tie or within the margin), then both are tried again.
#include "server/produce/rule_trial.h"

#include <gtest/gtest.h>

namespace batchcast {
namespace {

using Rule = RuleTrial::Rule;

// A stream whose consumers are sent a rate of samples a second under each rule, stepped every
// 10 ms of a fake clock; they wait for data unless `waits` is false.
struct Stepped {
  RuleTrial trial{RuleTrial::Timing{0.5, 1.0, 15.0, 0.03}};
  double now = 0;
  double sent = 0;
  bool waits = true;
  Rule rule = Rule::kDefault;
  // Steps until `until`; adds the seconds spent following each rule to `seconds`.
  void to(double until, double default_rate, double alternative_rate, double* seconds = nullptr) {
    for (; now < until; now += 0.01) {
      rule = trial.at(now, static_cast<uint64_t>(sent), waits);
      sent += 0.01 * (rule == Rule::kDefault ? default_rate : alternative_rate);
      if (seconds) seconds[rule == Rule::kDefault ? 0 : 1] += 0.01;
    }
  }
};

TEST(RuleTrial, TheAlternativeWinsWhenConsumersAreSentMoreUnderIt) {
  Stepped run;
  double seconds[2] = {0, 0};
  run.to(3.5, 8000, 9400, seconds);
  EXPECT_EQ(run.trial.trials(), 1u);
  EXPECT_EQ(run.trial.kept(), Rule::kAlternative);
  EXPECT_NEAR(*run.trial.rate(Rule::kDefault), 8000, 50);
  EXPECT_NEAR(*run.trial.rate(Rule::kAlternative), 9400, 50);
  // Kept for 15 s, then both tried again: 1.5 s of each per cycle of 18 s.
  run.to(3.5 + 18, 8000, 9400, seconds);
  EXPECT_EQ(run.trial.trials(), 2u);
  EXPECT_EQ(run.rule, Rule::kAlternative);
  EXPECT_NEAR(seconds[0], 3.0, 0.3) << "the default's two trial windows, settling included";
}

TEST(RuleTrial, NoTrialWhileConsumersDoNotWait) {
  // Trainers warming up, or a stream the CPU keeps up with: the rules differ little there and
  // what consumers are sent says nothing of them. The trial waits for consumers that wait.
  Stepped run;
  run.waits = false;
  run.to(30, 100, 300);
  EXPECT_EQ(run.trial.trials(), 0u);
  EXPECT_EQ(run.rule, Rule::kDefault);
  run.waits = true;
  run.to(33.5, 8000, 9400);
  EXPECT_EQ(run.trial.trials(), 1u);
  EXPECT_EQ(run.rule, Rule::kAlternative);
}

TEST(RuleTrial, ATieOrLessThanTheMarginKeepsTheDefault) {
  for (double alternative : {8000.0, 8200.0, 4000.0}) {
    Stepped run;
    run.to(3.5, 8000, alternative);
    EXPECT_EQ(run.trial.trials(), 1u) << alternative;
    EXPECT_EQ(run.trial.kept(), Rule::kDefault) << alternative;
    EXPECT_EQ(run.rule, Rule::kDefault) << alternative;
  }
  Stepped idle;  // nobody reads: nothing sent under either
  idle.to(3.5, 0, 0);
  EXPECT_EQ(idle.trial.kept(), Rule::kDefault);
}

TEST(RuleTrial, TheBetterRuleFollowsTheConsumersAcrossTrials) {
  // Trainers change (one leaves): the default becomes the better one at the next trial.
  Stepped run;
  run.to(3.5, 8000, 9400);
  EXPECT_EQ(run.trial.kept(), Rule::kAlternative);
  run.to(40, 9000, 7000);
  EXPECT_EQ(run.trial.kept(), Rule::kDefault);
  EXPECT_EQ(run.rule, Rule::kDefault);
}

TEST(RuleTrial, AKeptAlternativeIsTriedAgainWhenConsumersNoLongerWait) {
  // The engine alone was better while consumers waited; then they stop waiting (the trainers
  // got slower): the next trial finds both rules alike and goes back to the default.
  Stepped run;
  run.to(3.5, 8000, 9400);
  ASSERT_EQ(run.rule, Rule::kAlternative);
  run.waits = false;
  run.to(3.5 + 15 + 3.5, 5000, 5000);
  EXPECT_EQ(run.trial.trials(), 2u);
  EXPECT_EQ(run.rule, Rule::kDefault);
  run.to(60, 5000, 5000);
  EXPECT_EQ(run.trial.trials(), 2u) << "the default, consumers not waiting: no further trial";
}

TEST(RuleTrial, AWindowThatNothingEndedForLongIsGivenUp) {
  // The readers left mid-window and no chunk was chosen for 5 s: that window's rate says nothing
  // of its rule (it would lose at once), so the trial is given up until consumers wait again.
  RuleTrial trial(RuleTrial::Timing{0.5, 1.0, 15.0, 0.03});
  for (int i = 0; i < 20; ++i) trial.at(0.0, 0, true);
  EXPECT_EQ(trial.at(0.6, 600, true), Rule::kDefault);  // the window starts
  EXPECT_EQ(trial.at(5.6, 700, false), Rule::kDefault);  // given up: the default, kept
  EXPECT_FALSE(trial.rate(Rule::kDefault));
  EXPECT_EQ(trial.trials(), 0u);
}

TEST(RuleTrial, AWindowLastsAsLongAsTheCallsMakeIt) {
  // Calls 0.4 s apart: windows end late, and each rate is over the time its window lasted.
  RuleTrial trial(RuleTrial::Timing{0.5, 1.0, 15.0, 0.03});
  for (int i = 0; i < 20; ++i) trial.at(0.0, 0, true);  // consumers wait: the trial begins
  EXPECT_EQ(trial.at(0.4, 400, true), Rule::kDefault);     // settling
  EXPECT_EQ(trial.at(0.8, 800, true), Rule::kDefault);     // the window starts
  EXPECT_EQ(trial.at(1.6, 1600, true), Rule::kDefault);
  EXPECT_EQ(trial.at(2.0, 2000, true), Rule::kAlternative);  // ended after 1.2 s: 1000/s
  EXPECT_DOUBLE_EQ(*trial.rate(Rule::kDefault), 1000);
  EXPECT_FALSE(trial.rate(Rule::kAlternative));
}

}  // namespace
}  // namespace batchcast
