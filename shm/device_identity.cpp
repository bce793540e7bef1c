#include "shm/device_identity.h"

#include <cstdio>

namespace batchcast {

namespace {

// "a,b,c" -> {"a", "b", "c"}; "" -> {""}.
std::vector<std::string> comma_items(const std::string& text) {
  std::vector<std::string> items;
  size_t from = 0;
  for (size_t comma; (comma = text.find(',', from)) != std::string::npos; from = comma + 1)
    items.push_back(text.substr(from, comma - from));
  items.push_back(text.substr(from));
  return items;
}

constexpr const char* kForms =
    "use one of {cpu,cuda}, cuda:K (K a GPU index), or GPU-<uuid> / MIG-<uuid> (a MIG instance) "
    "as nvidia-smi -L prints it";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// 8-4-4-4-12 hex digits, dashes exactly there.
std::optional<DeviceUuid> parse_uuid(const std::string& s) {
  if (s.size() != 36) return std::nullopt;
  DeviceUuid out{};
  size_t nibble = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    bool dash_here = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash_here != (s[i] == '-')) return std::nullopt;
    if (dash_here) continue;
    int v = hex_value(s[i]);
    if (v < 0) return std::nullopt;
    out[nibble / 2] = static_cast<uint8_t>(out[nibble / 2] | (nibble % 2 ? v : v << 4));
    ++nibble;
  }
  return out;
}

}  // namespace

std::optional<DeviceSpec> parse_device_spec(const std::string& text) {
  DeviceSpec spec;
  if (text == "cpu") return spec;
  if (text == "cuda") return DeviceSpec{DeviceSpec::Kind::kIndex, 0, {}, false};
  if (text.rfind("cuda:", 0) == 0) {
    const std::string index = text.substr(5);
    // A few digits at most, so that the index always fits an int.
    if (index.empty() || index.size() > 5 ||
        index.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    return DeviceSpec{DeviceSpec::Kind::kIndex, std::stoi(index), {}, false};
  }
  const bool mig = text.rfind("MIG-", 0) == 0;
  if (mig || text.rfind("GPU-", 0) == 0) {
    auto uuid = parse_uuid(text.substr(4));
    if (!uuid) return std::nullopt;
    return DeviceSpec{DeviceSpec::Kind::kUuid, -1, *uuid, mig};
  }
  return std::nullopt;
}

std::string device_spec_error(const std::string& text) {
  if (parse_device_spec(text)) return {};
  if (text.rfind("MIG-GPU-", 0) == 0)
    return text +
           " is a MIG name of drivers before R470: give the instance's MIG-<uuid> from "
           "nvidia-smi -L";
  return text + " is not a device: " + kForms;
}

std::optional<DeviceList> parse_device_list(const std::string& text) {
  DeviceList list;
  if (text == "all") {
    list.all = true;
    return list;
  }
  const std::vector<std::string> items = comma_items(text);
  for (const std::string& item : items) {
    auto spec = parse_device_spec(item);
    if (!spec || (items.size() > 1 && spec->kind == DeviceSpec::Kind::kCpu)) return std::nullopt;
    list.devices.push_back(*spec);
  }
  return list;
}

std::string device_list_error(const std::string& text) {
  if (parse_device_list(text)) return {};
  for (const std::string& item : comma_items(text)) {
    if (std::string why = device_spec_error(item); !why.empty()) return why;
    if (item == "cpu")  // parse_device_list refused it, so it is not alone
      return text + ": cpu stands alone (a host pool); list GPUs only, e.g. cuda:0,cuda:1";
  }
  return text + " is not a device list";
}

std::string cuda_list(const std::vector<int>& indices) {
  std::string out;
  for (int i : indices) out += (out.empty() ? "cuda:" : ", cuda:") + std::to_string(i);
  return out;
}

std::string format_device_uuid(const DeviceUuid& uuid, bool mig) {
  std::string out = mig ? "MIG-" : "GPU-";
  char hex[3];
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    std::snprintf(hex, sizeof hex, "%02x", uuid[i]);
    out += hex;
  }
  return out;
}

bool is_mig_device(const std::string& name) { return name.find(" MIG ") != std::string::npos; }

std::string describe_device(const VisibleDevice& d) {
  return "cuda:" + std::to_string(d.index) + " = " + d.name + " (" +
         format_device_uuid(d.uuid, is_mig_device(d.name)) + ")";
}

std::string unreachable_pool_message(const std::vector<DeviceUuid>& pool,
                                     const std::vector<VisibleDevice>& visible) {
  // The Welcome carries only the UUID's bytes: whether it is an instance is not known here.
  std::string uuids;
  for (size_t i = 0; i < pool.size(); ++i) {
    const std::string uuid = format_device_uuid(pool[i], false).substr(4);
    uuids += (i ? ", " : "") + uuid + " (nvidia-smi -L: GPU-" + uuid + " or MIG-" + uuid + ")";
  }
  std::string msg = "the server's GPU pool is on the device" +
                    std::string(pool.size() > 1 ? "s" : "") + " with UUID " + uuids + ", ";
  if (visible.empty())
    return msg +
           "but this process sees no CUDA device (no GPU, no driver, or CUDA_VISIBLE_DEVICES "
           "hides it); run it with that device in CUDA_VISIBLE_DEVICES, or serve a host pool "
           "(--device cpu)";
  bool in_mig = false;
  msg += "none of which is one of this process's devices: ";
  for (size_t i = 0; i < visible.size(); ++i) {
    msg += (i ? ", " : "") + describe_device(visible[i]);
    in_mig = in_mig || is_mig_device(visible[i].name);
  }
  if (in_mig)
    return msg +
           ". CUDA IPC cannot cross MIG instances: run this process in the server's instance "
           "(CUDA_VISIBLE_DEVICES=MIG-" +
           (pool.size() == 1 ? format_device_uuid(pool.front(), false).substr(4) : "<uuid>") +
           "), or serve a host pool (--device cpu) that every instance can read, or start one "
           "server per instance (--device MIG-<uuid>)";
  return msg +
         ". CUDA IPC shares memory on one device only: run this process with one of those GPUs "
         "in CUDA_VISIBLE_DEVICES, or serve a host pool (--device cpu), or serve this GPU too "
         "(--device cuda:0,cuda:1 or --device all)";
}

ArenaChoice choose_pool_arena(const std::vector<DeviceUuid>& pool,
                              const std::vector<VisibleDevice>& visible, int wanted, int current) {
  auto arena_on = [&](int index) {
    for (const auto& v : visible)
      if (v.index == index)
        for (size_t a = 0; a < pool.size(); ++a)
          if (pool[a] == v.uuid) return static_cast<int>(a);
    return -1;
  };
  ArenaChoice c;
  if (wanted >= 0) {
    c.arena = arena_on(wanted);
    if (c.arena >= 0) {
      c.device = wanted;
      return c;
    }
    std::vector<int> here;  // the pool's devices this process sees
    for (const auto& v : visible)
      for (const auto& p : pool)
        if (p == v.uuid) here.push_back(v.index);
    if (here.empty()) {
      c.error = unreachable_pool_message(pool, visible);
      return c;
    }
    c.error = "the server's GPU pool is on " + cuda_list(here) + " of this process, not on cuda:" +
              std::to_string(wanted) +
              "; batchcast hands out zero-copy tensors only on the pool's GPUs: read on one of "
              "them (and .to() yourself), or serve this GPU too (--device cuda:0,cuda:1 or "
              "--device all), or start one server per GPU";
    return c;
  }
  c.arena = arena_on(current);
  if (c.arena >= 0) {
    c.device = current;
    return c;
  }
  for (size_t a = 0; a < pool.size(); ++a)  // the pool's order: its primary GPU first
    for (const auto& v : visible)
      if (v.uuid == pool[a]) {
        c.arena = static_cast<int>(a);
        c.device = v.index;
        return c;
      }
  c.error = unreachable_pool_message(pool, visible);
  return c;
}

}  // namespace batchcast
