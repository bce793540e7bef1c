// Parsing probe_consumer's output (tests/cpp/support/probe_consumer.cpp): its B (batch),
// E (epoch end) and S (summary) lines. Shared by the transport and hardening tests.
#pragma once

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cpp/support/processes.h"

namespace batchcast::testing {

struct ProbeRun {
  struct Batch {
    uint64_t epoch = 0, start = 0, size = 0;
    bool copied = false;
    std::vector<int64_t> indices;
    std::string hash;  // of the batch's bytes: equal batches of two consumers are identical
  };
  std::vector<Batch> batches;
  std::set<uint64_t> ended_epochs;  // epochs whose E line was printed
  uint64_t skipped = 0, copies = 0;
  bool finished = false;  // the S line was printed
  std::map<uint64_t, std::vector<int64_t>> per_epoch() const {
    std::map<uint64_t, std::vector<int64_t>> m;
    for (const auto& b : batches)
      m[b.epoch].insert(m[b.epoch].end(), b.indices.begin(), b.indices.end());
    return m;
  }
};

inline ProbeRun parse_probe(const ChildProcess& p) {
  ProbeRun r;
  for (const auto& line : p.out_lines()) {
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "B") {
      ProbeRun::Batch b;
      int copied;
      std::string idx;
      if (!(in >> b.epoch >> b.start >> b.size >> copied >> idx >> b.hash)) continue;  // torn line
      b.copied = copied != 0;
      std::istringstream ids(idx);
      for (std::string t; std::getline(ids, t, ',');) b.indices.push_back(std::stoll(t));
      r.batches.push_back(std::move(b));
    } else if (kind == "E") {
      uint64_t e;
      if (in >> e) r.ended_epochs.insert(e);
    } else if (kind == "S") {
      uint64_t batches, samples;
      in >> batches >> samples >> r.skipped >> r.copies;
      r.finished = true;
    }
  }
  return r;
}

}  // namespace batchcast::testing
