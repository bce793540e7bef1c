// StreamState's catch-ups (stream_state.h, "Catch up"): the paces it measures and the decoupled
// consumer the stream waits for while it catches up. A consumer decoupled for holding the stream
// back while it had stopped (a trainer warming up, one that validated) reads private chunks;
// where the producer is what every reader waits for (nvJPEG on a GPU the trainers keep busy, a
// CPU decoding for all), those chunks take their share of it from the stream for good, and a
// reader faster than the stream never closes its gap. Stopping the stream until it has merged
// costs the others that gap once instead. A consumer decoupled for reading slowly is never
// caught up first: a trainer paced below the stream that is behind its own schedule reads in
// bursts as fast as it is served, which no pace measured over seconds tells from a fast one.
// The rest of the stalls are in stream_stalls.cpp.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "server/stream/stream_state.h"

namespace batchcast {

namespace {
// Paces are taken over windows this long: several heartbeats and chunks, short enough to see a
// trainer back from a pause within a stall bound.
constexpr double kPaceWindowS = 2.0;
// A decoupled consumer catches up first when its own pace is this much above the stream's...
constexpr double kFasterThanTheStream = 1.25;
// ... and it waited for its chunks this share of the window (the producer keeps it short).
constexpr double kStarvedShare = 0.25;
// The others wait for a catch-up estimated at most this long (a trainer back from validation or
// a checkpoint); a reader further behind stays on private chunks.
constexpr double kCatchUpAtMostS = 10.0;
}  // namespace

void StreamState::watch_paces(double now) {
  if (pace_mark_.t >= 0 && now - pace_mark_.t < kPaceWindowS) return;
  const double dt = now - pace_mark_.t;
  const bool measured = pace_mark_.t >= 0;
  if (measured) {
    stream_pace_ = (counters_.samples_published - pace_mark_.published) / dt;
    producer_pace_ = stream_pace_ + (regenerated_samples_ - pace_mark_.regenerated) / dt;
  }
  pace_mark_ = {now, counters_.samples_published, regenerated_samples_};
  for (auto& [id, c] : consumers_.all()) {
    auto& mark = c.pace_mark;
    if (mark.t >= 0 && c.samples >= mark.samples) {
      const double waited = std::clamp(c.wait_s - mark.wait_s, 0.0, now - mark.t);
      const double busy = std::max(now - mark.t - waited, 1e-3);
      c.own_pace = (c.samples - mark.samples) / busy;
      c.waited_share = waited / (now - mark.t);
    }
    mark = {now, c.samples, c.wait_s};
  }
}

void StreamState::watch_catch_up(double now) {
  if (catching_up_) {
    auto it = consumers_.all().find(*catching_up_);
    const bool reads = it != consumers_.all().end() && !it->second.end_sent && !it->second.closing;
    const auto* p = reads ? private_.find(*catching_up_) : nullptr;
    if (p && p->rejoin && now >= catch_up_until_)
      spdlog::warn("{} has not caught up in time: the stream goes on, it reads private chunks",
                   label(it->second, false));
    // Merged, left, ended, or late.
    if (!p || !p->rejoin || now >= catch_up_until_) catching_up_.reset();
  }
  if (!catching_up_ && rules_.stall_policy == StallPolicy::kDecouple && !finished_ &&
      producer_pace_ > 0) {
    for (auto& [id, c] : consumers_.all()) {
      auto* p = private_.find(id);
      if (!p || !p->rejoin || !p->paused || p->caught_up_first || c.end_sent || c.closing ||
          !went_on_without(*p))  // it could not merge yet (try_rejoin)
        continue;
      if (c.own_pace < kFasterThanTheStream * stream_pace_ || c.waited_share < kStarvedShare)
        continue;
      const uint64_t behind = samples_behind(c);
      const double estimate = behind / producer_pace_;
      if (estimate > kCatchUpAtMostS) continue;
      p->caught_up_first = true;
      catching_up_ = id;
      catch_up_until_ = now + estimate + stall_bound(c);
      spdlog::info(
          "{} reads faster than the stream ({:.0f} samples/s against {:.0f}) and is {} samples "
          "behind: the stream waits while it catches up (about {:.1f} s)",
          label(c, false), c.own_pace, stream_pace_, behind, estimate);
      break;
    }
  }
  if (catching_up_)
    waiting_for_ += (waiting_for_.empty() ? "" : "; ") +
                    label(consumers_.all().at(*catching_up_), true) + ", catching up";
}

}  // namespace batchcast
