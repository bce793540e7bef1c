// Element types of the tensors batchcast moves, numbered as on the wire (protocol/) and
// mapped to DLPack codes for consumers; the one name for an element type everywhere (the image
// pipeline's output type included). Plain values and pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"

namespace batchcast {

enum class DType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kBFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBool = 9,
};
constexpr uint8_t kDTypeCount = 10;

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kBool:
      return 1;
    case DType::kInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  static const char* const kNames[] = {"uint8",   "int8",     "int16",   "int32",   "int64",
                                       "float16", "bfloat16", "float32", "float64", "bool"};
  auto i = static_cast<uint8_t>(t);
  return i < kDTypeCount ? kNames[i] : "invalid";
}

// `types` as "float32, float16, ..." for messages that list the valid names.
inline std::string dtype_names(const std::vector<DType>& types) {
  std::string out;
  for (DType t : types) out += (out.empty() ? "" : ", ") + std::string(dtype_name(t));
  return out;
}

// The DType spelled `name` as dtype_name() spells it, among `accepted` (empty: every DType).
// Anything else throws Error listing the accepted names.
inline DType parse_dtype(const std::string& name, const std::vector<DType>& accepted = {}) {
  std::vector<DType> valid = accepted;
  if (valid.empty())
    for (uint8_t i = 0; i < kDTypeCount; ++i) valid.push_back(static_cast<DType>(i));
  for (DType t : valid)
    if (name == dtype_name(t)) return t;
  throw Error("unknown dtype '" + name + "'; valid: " + dtype_names(valid));
}

}  // namespace batchcast
