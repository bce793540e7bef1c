#include "metrics/rapl.h"

#include <filesystem>
#include <fstream>

namespace batchcast::metrics {
namespace {

namespace fs = std::filesystem;

std::optional<uint64_t> read_u64(const std::string& path) {
  std::ifstream in(path);
  uint64_t v = 0;
  if (!(in >> v)) return std::nullopt;
  return v;
}

}  // namespace

std::optional<Rapl> Rapl::open(const std::string& root, std::string* why_not) {
  auto fail = [&](std::string why) -> std::optional<Rapl> {
    if (why_not != nullptr) *why_not = std::move(why);
    return std::nullopt;
  };
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return fail("no " + root + " (no RAPL); CPU energy is omitted");
  Rapl rapl;
  bool unreadable = false;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    // Top-level package zones only: "intel-rapl:0", not "intel-rapl:0:0" (a part of it).
    const auto colon = name.find(':');
    if (colon == std::string::npos || name.find(':', colon + 1) != std::string::npos) continue;
    const std::string energy = (entry.path() / "energy_uj").string();
    auto now = read_u64(energy);
    auto max = read_u64((entry.path() / "max_energy_range_uj").string());
    if (!now || !max) {
      unreadable = unreadable || fs::exists(energy, ec);
      continue;
    }
    rapl.zones_.push_back(Zone{energy, *max, *now, 0});
  }
  if (rapl.zones_.empty()) {
    return fail(unreadable ? "RAPL energy_uj under " + root +
                                 " is readable by root only on this kernel; CPU energy is omitted"
                           : "no RAPL package zone under " + root + "; CPU energy is omitted");
  }
  return rapl;
}

double Rapl::joules() {
  uint64_t sum = 0;
  for (Zone& z : zones_) {
    if (auto now = read_u64(z.energy_path)) {
      // A reading below the last one means the counter wrapped once since then.
      z.total_uj += *now >= z.last_uj ? *now - z.last_uj : z.max_uj - z.last_uj + *now;
      z.last_uj = *now;
    }
    sum += z.total_uj;
  }
  return static_cast<double>(sum) * 1e-6;
}

}  // namespace batchcast::metrics
