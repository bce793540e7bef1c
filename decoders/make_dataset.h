// make_dataset: writes a synthetic-but-realistic ImageFolder tree of JPEGs for benchmarks and
// tests, cut from real photos (ImageNet-like content statistics matter for decode speed: flat
// synthetic patterns decode several times faster than photos).
//
// Contract: a plain function; deterministic for (source photos, options). Reentrant (no shared
// state), but two calls must not write the same out_dir at once. Throws Error naming the folder
// at fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace batchcast {

struct MakeDatasetOptions {
  // Where the real photos are found (recursively; .jpg/.jpeg via TurboJPEG, .png via libpng).
  // Default: Debian's desktop backgrounds (package mate-backgrounds and friends).
  std::string source_dir = "/usr/share/backgrounds";
  std::string out_dir;  // required; created if missing
  int classes = 10;     // class folders class_000 ...
  int images_per_class = 40;
  uint64_t seed = 0;
};

struct MakeDatasetReport {
  size_t images = 0;  // files written
  size_t bytes = 0;   // their total size
  int classes = 0;
  size_t sources = 0;  // photos found under source_dir
};

// Writes out_dir/class_NNN/img_NNNNN.jpg: random crops of the photos resized to ImageNet-typical
// sizes (shorter side 300..500, aspect 3:4..4:3, 5% grayscale), JPEG quality 75..95 (4:2:0, some
// 4:4:4). Throws Error if source_dir holds no photo (suggesting `apt-get install
// mate-backgrounds`).
MakeDatasetReport make_dataset(const MakeDatasetOptions& options);

}  // namespace batchcast
