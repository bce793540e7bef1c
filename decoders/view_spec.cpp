#include "decoders/view_spec.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/random.h"

namespace batchcast {
namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.push_back("");
  return parts;
}

template <typename T>
std::string name_of(const std::map<std::string, T>& names, T value) {
  for (const auto& [name, v] : names)
    if (v == value) return name;
  return "?";
}

template <typename T>
std::string choices(const std::map<std::string, T>& names) {
  std::string out;
  for (const auto& [name, v] : names) out += (out.empty() ? "" : "|") + name;
  return out;
}

// The shortest text that reads back as the same value (floats as floats: 0.485, not the
// double nearest to the float), without locale.
template <typename T>
std::string number_text(T v) {
  char buffer[64];
  return std::string(buffer, std::to_chars(buffer, buffer + sizeof(buffer), v).ptr);
}

}  // namespace

ViewSpec parse_view_spec(const std::string& text, const PipelineOptions& base) {
  ViewSpec spec{base, std::nullopt};
  PipelineOptions& o = spec.options;
  auto fail = [&](const std::string& field, const std::string& why) {
    throw Error("view '" + text + "': " + field + " " + why);
  };
  auto number = [&](const std::string& field, const std::string& value) {
    double v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(v))
      fail(field, "must be a number (got '" + value + "')");
    return v;
  };
  auto integer = [&](const std::string& field, const std::string& value, int64_t lo, int64_t hi) {
    int64_t v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size())
      fail(field, "must be a whole number (got '" + value + "')");
    if (v < lo || v > hi)
      fail(field,
           "must be in " + std::to_string(lo) + ".." + std::to_string(hi) + " (got " + value + ")");
    return v;
  };
  auto numbers = [&](const std::string& field, const std::string& value, size_t n) {
    auto parts = split(value, ':');
    if (parts.size() != n)
      fail(field, "takes " + std::to_string(n) + " numbers separated by ':' (got '" + value + "')");
    std::vector<double> out;
    for (const auto& p : parts) out.push_back(number(field, p));
    return out;
  };
  auto choice = [&](const std::string& field, const std::string& value, const auto& names) {
    auto it = names.find(value);
    if (it == names.end()) fail(field, "'" + value + "' is not one of " + choices(names));
    return it->second;
  };
  if (!text.empty()) {
    for (const std::string& item : split(text, ',')) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos)
        fail("'" + item + "'",
             "is not FIELD=VALUE (fields: size, crop, scale, ratio, flip, "
             "resize, interpolation, output, layout, mean, std, seed)");
      const std::string field = item.substr(0, eq);
      const std::string value = item.substr(eq + 1);
      if (field == "size") {
        o.image_size = static_cast<int>(integer(field, value, 1, 16384));
      } else if (field == "crop") {
        static const std::map<std::string, bool> kCrops = {{"random", true}, {"center", false}};
        o.train = choice(field, value, kCrops);
      } else if (field == "scale" || field == "ratio") {
        auto v = numbers(field, value, 2);
        std::array<double, 2>& range = field == "scale" ? o.scale : o.ratio;
        range = {v[0], v[1]};
      } else if (field == "flip") {
        o.flip_p = number(field, value);
        if (!(o.flip_p >= 0 && o.flip_p <= 1)) fail(field, "must be in 0..1 (got " + value + ")");
      } else if (field == "resize") {
        o.resize_size = static_cast<int>(integer(field, value, 0, 65536));
      } else if (field == "interpolation") {
        o.interpolation = choice(field, value, kInterpolationNames);
      } else if (field == "output") {
        o.output = choice(field, value, kOutputNames);
      } else if (field == "layout") {
        o.uint8_layout = choice(field, value, kUint8LayoutNames);
      } else if (field == "mean" || field == "std") {
        auto v = numbers(field, value, 3);
        auto& target = field == "mean" ? o.mean : o.std;
        for (int c = 0; c < 3; ++c) target[c] = static_cast<float>(v[c]);
      } else if (field == "seed") {
        uint64_t seed = 0;
        auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seed);
        if (ec != std::errc() || end != value.data() + value.size())
          fail(field, "must be a whole number 0..2^64-1 (got '" + value + "')");
        spec.seed = o.seed = seed;
      } else {
        fail("'" + field + "'",
             "is not a view field (fields: size, crop, scale, ratio, flip, "
             "resize, interpolation, output, layout, mean, std, seed)");
      }
    }
  }
  try {
    ImagePipeline check(o);  // what the pipeline itself refuses (scale, ratio, std, resize)
  } catch (const Error& e) {
    throw Error("view '" + text + "': " + e.what());
  }
  return spec;
}

std::string view_spec_text(const PipelineOptions& o, bool with_seed) {
  std::ostringstream out;
  out << "size=" << o.image_size << ",crop=" << (o.train ? "random" : "center")
      << ",scale=" << number_text(o.scale[0]) << ":" << number_text(o.scale[1])
      << ",ratio=" << number_text(o.ratio[0]) << ":" << number_text(o.ratio[1])
      << ",flip=" << number_text(o.flip_p) << ",resize="
      << (o.train         ? 0
          : o.resize_size ? o.resize_size
                          : eval_resize_size(o.image_size))
      << ",interpolation=" << name_of(kInterpolationNames, o.interpolation)
      << ",output=" << dtype_name(o.output)
      << ",layout=" << name_of(kUint8LayoutNames, o.uint8_layout)
      << ",mean=" << number_text(o.mean[0]) << ":" << number_text(o.mean[1]) << ":"
      << number_text(o.mean[2]) << ",std=" << number_text(o.std[0]) << ":" << number_text(o.std[1])
      << ":" << number_text(o.std[2]);
  if (with_seed) out << ",seed=" << o.seed;
  return out.str();
}

uint64_t view_seed(uint64_t stream_seed, const PipelineOptions& options) {
  // FNV-1a of the canonical text: stable across builds and platforms.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : view_spec_text(options, false)) h = (h ^ ch) * 1099511628211ull;
  return hash_combine(stream_seed, h);
}

PipelineOptions resolve_view(const std::string& text, const PipelineOptions& transform) {
  ViewSpec spec = parse_view_spec(text, transform);
  if (!spec.seed)
    spec.options.seed = view_spec_text(spec.options, false) == view_spec_text(transform, false)
                            ? transform.seed
                            : view_seed(transform.seed, spec.options);
  return spec.options;
}

}  // namespace batchcast
