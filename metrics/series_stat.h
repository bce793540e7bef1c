// Stat: the running mean and peak of one metric series, for summary.json (a value type; not
// thread-safe: the collector guards it with its data lock). An absent reading (nullopt) is
// skipped, so a mean is over the ticks that had a value.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

namespace batchcast::metrics {

struct Stat {
  double sum = 0, peak = 0;
  int64_t n = 0;
  void add(std::optional<double> v) {
    if (!v) return;
    sum += *v;
    peak = n ? std::max(peak, *v) : *v;
    ++n;
  }
  // null in JSON when no tick had a value.
  nlohmann::json mean() const { return n ? nlohmann::json(sum / n) : nlohmann::json(nullptr); }
  nlohmann::json max() const { return n ? nlohmann::json(peak) : nlohmann::json(nullptr); }
};

}  // namespace batchcast::metrics
