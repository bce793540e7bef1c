#include "decoders/view.h"

#include <array>
#include <charconv>
#include <cmath>
#include <sstream>
#include <type_traits>

#include "common/error.h"
#include "common/named.h"
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

// One field's value in a view text.
template <typename T>
std::string value_text(const T& value, const std::map<std::string, T>* names) {
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
    if (!names) return number_text(value);
  return names ? name_of(value, *names).value_or("?") : "?";
}
template <typename T, size_t N>
std::string value_text(const std::array<T, N>& values, const std::map<std::string, T>*) {
  std::string out;
  for (size_t i = 0; i < N; ++i) out += (i ? ":" : "") + number_text(values[i]);
  return out;
}

// Reads one field's value; `fail(why)` throws naming the field.
template <typename Fail>
double read_number(const std::string& value, const ValueRule& rule, const Fail& fail) {
  double v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(v))
    fail("must be a number (got '" + value + "')");
  if (!rule.holds(v)) fail(std::string("must be ") + rule.words + " (got " + value + ")");
  return v;
}

template <typename T, typename Fail>
void read_value(const std::string& value, const ValueRule& rule,
                const std::map<std::string, T>* names, T& out, const Fail& fail) {
  if (names) {
    auto it = names->find(value);
    if (it == names->end()) fail("'" + value + "' is not one of " + names_joined(*names, "|"));
    out = it->second;
  } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    T v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size())
      fail("must be a whole number" +
           std::string(std::is_unsigned_v<T> ? " 0..2^64-1" : "") + " (got '" + value + "')");
    if (!rule.holds(static_cast<double>(v)))
      fail(std::string("must be ") + rule.words + " (got " + value + ")");
    out = v;
  } else if constexpr (std::is_arithmetic_v<T>) {
    out = static_cast<T>(read_number(value, rule, fail));
  }
}
template <typename T, size_t N, typename Fail>
void read_value(const std::string& value, const ValueRule& rule,
                const std::map<std::string, T>*, std::array<T, N>& out, const Fail& fail) {
  const auto parts = split(value, ':');
  if (parts.size() != N)
    fail("takes " + std::to_string(N) + " numbers separated by ':' (got '" + value + "')");
  for (size_t i = 0; i < N; ++i) out[i] = static_cast<T>(read_number(parts[i], rule, fail));
}

// Eval's resize size as the pipeline uses it (0 derives it from the size); training ignores it.
int effective_resize(const PipelineOptions& o) {
  if (o.train) return 0;
  return o.resize_size ? o.resize_size : eval_resize_size(o.image_size);
}

}  // namespace

std::string view_field_names() {
  std::string out;
  for_each_view_field([&](const ViewField& f, auto, auto) {
    out += (out.empty() ? "" : ", ") + std::string(f.name);
  });
  return out;
}

View View::parse(const std::string& text, const View& base) {
  View view = base;
  view.seed_given_ = false;
  PipelineOptions& o = view.options_;
  for (const std::string& item : text.empty() ? std::vector<std::string>() : split(text, ',')) {
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    if (eq == std::string::npos)
      throw Error("view '" + text + "': '" + item + "' is not FIELD=VALUE (fields: " +
                  view_field_names() + ")");
    bool known = false;
    for_each_view_field([&](const ViewField& f, auto member, auto names) {
      if (known || name != f.name) return;
      known = true;
      auto fail = [&](const std::string& why) {
        throw Error("view '" + text + "': " + f.name + " " + why);
      };
      read_value(item.substr(eq + 1), f.rule, names, o.*member, fail);
    });
    if (!known)
      throw Error("view '" + text + "': '" + name + "' is not a view field (fields: " +
                  view_field_names() + ")");
    if (name == "seed") view.seed_given_ = true;
  }
  try {
    ImagePipeline check(o);  // what the pipeline itself refuses (scale, ratio, resize)
  } catch (const Error& e) {
    throw Error("view '" + text + "': " + e.what());
  }
  return view;
}

View View::resolve(const std::string& text, const View& transform) {
  View view = parse(text, transform);
  if (!view.seed_given_)
    view.options_.seed = view.same_transform(transform)
                             ? transform.options_.seed
                             : view.derived_seed(transform.options_.seed);
  return view;
}

std::string View::text(bool with_seed) const {
  PipelineOptions o = options_;
  o.resize_size = effective_resize(o);
  std::string out;
  for_each_view_field([&](const ViewField& f, auto member, auto names) {
    if (!with_seed && std::string(f.name) == "seed") return;
    out += (out.empty() ? "" : ",") + std::string(f.name) + "=" + value_text(o.*member, names);
  });
  return out;
}

uint64_t View::derived_seed(uint64_t stream_seed) const {
  // FNV-1a of the canonical text: stable across builds and platforms.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text(false)) h = (h ^ ch) * 1099511628211ull;
  return hash_combine(stream_seed, h);
}

bool View::same_transform(const View& other) const {
  PipelineOptions a = options_, b = other.options_;
  a.resize_size = effective_resize(a);
  b.resize_size = effective_resize(b);
  bool same = true;
  for_each_view_field([&](const ViewField& f, auto member, auto) {
    if (std::string(f.name) != "seed") same = same && a.*member == b.*member;
  });
  return same;
}

}  // namespace batchcast
