// Values as texts spell them: a value of a named set (a policy, a dtype, an interpolation) by its
// name in that set's table (name -> value, the one table each set has), and a number in its
// shortest exact form (0.485 for the float 0.485, not the double nearest to it; no locale). The
// command line, view texts, the Python bindings and their errors all spell values through these.
//
// Contract: pure functions; thread-safe.
#pragma once

#include <charconv>
#include <map>
#include <optional>
#include <string>

namespace batchcast {

// The name of `value` in `names`, if it has one (the first, in the table's order).
template <typename T>
std::optional<std::string> name_of(const T& value, const std::map<std::string, T>& names) {
  for (const auto& [name, v] : names)
    if (v == value) return name;
  return std::nullopt;
}

// Every name of `names`, in the table's order, `separator` between them ("cpu|mixed|nvjpeg").
template <typename T>
std::string names_joined(const std::map<std::string, T>& names, const char* separator) {
  std::string out;
  for (const auto& [name, v] : names) out += (out.empty() ? "" : separator) + name;
  return out;
}

// A number's shortest text that reads back as the same value.
template <typename T>
std::string number_text(T value) {
  char buffer[64];
  return std::string(buffer, std::to_chars(buffer, buffer + sizeof(buffer), value).ptr);
}

}  // namespace batchcast
