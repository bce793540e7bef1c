#include "protocol/messages.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/error.h"

namespace batchcast::protocol {
namespace {

// Appends little-endian fields to a byte string.
class Writer {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_arithmetic_v<T>);
    char bytes[sizeof(T)];
    std::memcpy(bytes, &v, sizeof(T));  // x86-64 and aarch64 are little-endian
    out_.append(bytes, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint16_t>(static_cast<uint16_t>(s.size()));
    out_.append(s);
  }
  void put_bytes(const uint8_t* data, size_t n) {
    out_.append(reinterpret_cast<const char*>(data), n);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads little-endian fields; the first failure sticks and later reads return zeros.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  template <typename T>
  T get() {
    T v{};
    if (!need(sizeof(T))) return v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string get_string() {
    auto n = get<uint16_t>();
    if (n > kMaxString) return fail("string longer than " + std::to_string(kMaxString)), "";
    if (!need(n)) return "";
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  void get_bytes(uint8_t* out, size_t n) {
    if (!need(n)) return;
    std::memcpy(out, p_, n);
    p_ += n;
  }
  void fail(const std::string& why) {
    if (error_.empty()) error_ = why;
  }
  bool ok() const { return error_.empty(); }
  bool at_end() const { return p_ == end_; }
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  const std::string& error() const { return error_; }

 private:
  bool need(size_t n) {
    if (!ok()) return false;
    if (static_cast<size_t>(end_ - p_) < n) {
      fail("truncated message");
      return false;
    }
    return true;
  }
  const uint8_t* p_;
  const uint8_t* end_;
  std::string error_;
};

void write_body(Writer& w, const Hello& m) {
  w.put(m.pid);
  w.put_string(m.boot_id);
  w.put_string(m.name);
  w.put(static_cast<uint8_t>(m.late_join));
  w.put(m.device_index);
  w.put(m.stall_timeout_s);
  w.put_string(m.view);
  w.put(static_cast<uint8_t>(m.order));
}
void read_body(Reader& r, Hello& m) {
  m.pid = r.get<uint32_t>();
  m.boot_id = r.get_string();
  m.name = r.get_string();
  auto lj = r.get<uint8_t>();
  if (lj > 1) r.fail("unknown late_join value " + std::to_string(lj));
  m.late_join = static_cast<LateJoin>(lj);
  m.device_index = r.get<uint32_t>();
  m.stall_timeout_s = r.get<double>();
  if (!(m.stall_timeout_s >= 0 && m.stall_timeout_s < 1e9)) r.fail("stall_timeout_s out of range");
  m.view = r.get_string();
  auto order = r.get<uint8_t>();
  if (order > static_cast<uint8_t>(Order::kRelaxed))
    r.fail("unknown order value " + std::to_string(order));
  m.order = static_cast<Order>(order);
}

void write_body(Writer& w, const Welcome& m) {
  w.put(m.consumer_id);
  w.put(m.server_pid);
  w.put_string(m.boot_id);
  w.put_string(m.segment_name);
  w.put(m.segment_bytes);
  w.put(m.slot_count);
  w.put(m.slot_bytes);
  w.put(m.slots_offset);
  w.put(m.chunk_size);
  w.put(m.epoch_samples);
  w.put(m.epochs);
  w.put(m.first_epoch);
  w.put(static_cast<uint8_t>(m.device));
  w.put(static_cast<uint8_t>(m.cuda_arenas.size()));
  for (const auto& a : m.cuda_arenas) {
    w.put_bytes(a.device_uuid.data(), a.device_uuid.size());
    w.put_bytes(a.memory_handle.data(), a.memory_handle.size());
    w.put(static_cast<uint16_t>(a.event_handles.size()));
    for (const auto& h : a.event_handles) w.put_bytes(h.data(), h.size());
  }
  w.put(m.heartbeat_interval_s);
  w.put(m.heartbeat_timeout_s);
  w.put(static_cast<uint8_t>(m.order));
}
void read_body(Reader& r, Welcome& m) {
  m.consumer_id = r.get<uint64_t>();
  m.server_pid = r.get<uint32_t>();
  m.boot_id = r.get_string();
  m.segment_name = r.get_string();
  m.segment_bytes = r.get<uint64_t>();
  m.slot_count = r.get<uint32_t>();
  m.slot_bytes = r.get<uint64_t>();
  m.slots_offset = r.get<uint64_t>();
  m.chunk_size = r.get<uint32_t>();
  m.epoch_samples = r.get<uint64_t>();
  m.epochs = r.get<uint64_t>();
  m.first_epoch = r.get<uint64_t>();
  auto dev = r.get<uint8_t>();
  if (dev > 1) r.fail("unknown device kind " + std::to_string(dev));
  m.device = static_cast<DeviceKind>(dev);
  auto arenas = r.get<uint8_t>();
  size_t events_total = 0;
  for (uint8_t a = 0; a < arenas && r.ok(); ++a) {
    CudaArena& arena = m.cuda_arenas.emplace_back();
    r.get_bytes(arena.device_uuid.data(), arena.device_uuid.size());
    r.get_bytes(arena.memory_handle.data(), arena.memory_handle.size());
    auto events = r.get<uint16_t>();
    events_total += events;
    if (events_total > kMaxCudaSlots)
      r.fail("more than " + std::to_string(kMaxCudaSlots) + " CUDA events");
    for (uint16_t i = 0; i < events && r.ok(); ++i)
      r.get_bytes(arena.event_handles.emplace_back().data(), kCudaIpcHandleBytes);
  }
  m.heartbeat_interval_s = r.get<double>();
  m.heartbeat_timeout_s = r.get<double>();
  if (!(m.heartbeat_interval_s > 0 && m.heartbeat_interval_s < 3600 && m.heartbeat_timeout_s > 0 &&
        m.heartbeat_timeout_s < 36000))
    r.fail("heartbeat interval/timeout out of range");
  auto order = r.get<uint8_t>();
  if (order != static_cast<uint8_t>(Order::kExact) &&
      order != static_cast<uint8_t>(Order::kRelaxed))
    r.fail("a welcome's order must be exact or relaxed, not " + std::to_string(order));
  m.order = static_cast<Order>(order);
  if (m.slot_count == 0 || m.slot_bytes == 0) r.fail("empty pool");
  const bool on_gpu = m.device == DeviceKind::kCuda;
  if (r.ok() && on_gpu == m.cuda_arenas.empty())
    r.fail(on_gpu ? "a CUDA pool without arenas" : "a host pool with CUDA arenas");
  for (const auto& a : m.cuda_arenas)
    if (r.ok() && a.event_handles.size() != m.slot_count)
      r.fail("welcome has " + std::to_string(a.event_handles.size()) + " CUDA event handles for " +
             std::to_string(m.slot_count) + " device slots");
}

void write_body(Writer& w, const ChunkDescriptor& m) {
  w.put(m.seq);
  w.put(m.position.epoch);
  w.put(m.position.index_in_epoch);
  w.put(m.position.sample_start);
  w.put(m.position.sample_count);
  w.put(m.position.epoch_samples);
  w.put(m.position.stream_position);
  w.put(static_cast<uint8_t>(m.position.epoch_end ? kFlagEpochEnd : 0));
  w.put(m.slot);
  w.put(static_cast<uint8_t>(m.tensors.size()));
  for (const auto& t : m.tensors) {
    w.put_string(t.name);
    w.put(static_cast<uint8_t>(t.dtype));
    w.put(static_cast<uint8_t>(t.shape.size()));
    for (auto d : t.shape) w.put(d);
    for (auto s : t.strides) w.put(s);
    w.put(t.offset);
  }
  w.put(static_cast<uint32_t>(m.take.size()));
  for (auto row : m.take) w.put(row);
  w.put(static_cast<uint32_t>(m.samples.size()));
  for (auto sample : m.samples) w.put(sample);
}
void read_body(Reader& r, ChunkDescriptor& m) {
  m.seq = r.get<uint64_t>();
  m.position.epoch = r.get<uint64_t>();
  m.position.index_in_epoch = r.get<uint64_t>();
  m.position.sample_start = r.get<uint64_t>();
  m.position.sample_count = r.get<uint32_t>();
  m.position.epoch_samples = r.get<uint64_t>();
  m.position.stream_position = r.get<uint64_t>();
  auto flags = r.get<uint8_t>();
  if (flags & ~kFlagAllFlags) r.fail("unknown descriptor flags");
  m.position.epoch_end = (flags & kFlagEpochEnd) != 0;
  m.slot = r.get<uint32_t>();
  auto n = r.get<uint8_t>();
  if (n == 0 || n > kMaxTensors)
    r.fail("tensor count " + std::to_string(n) + " not in 1.." + std::to_string(kMaxTensors));
  for (size_t i = 0; i < n && r.ok(); ++i) {
    TensorSpec t;
    t.name = r.get_string();
    auto dt = r.get<uint8_t>();
    if (dt >= kDTypeCount) r.fail("unknown dtype " + std::to_string(dt));
    t.dtype = static_cast<DType>(dt);
    auto nd = r.get<uint8_t>();
    if (nd == 0 || nd > kMaxDims) r.fail("tensor rank " + std::to_string(nd) + " not in 1..8");
    if (!r.ok()) break;
    t.shape.resize(nd);
    t.strides.resize(nd);
    for (auto& d : t.shape) d = r.get<int64_t>();
    for (auto& s : t.strides) s = r.get<int64_t>();
    t.offset = r.get<uint64_t>();
    m.tensors.push_back(std::move(t));
  }
  auto rows = r.get<uint32_t>();
  if (rows > kMaxTakeRows)
    r.fail("take of " + std::to_string(rows) + " rows exceeds " + std::to_string(kMaxTakeRows));
  else if (r.ok() && rows > r.left() / sizeof(uint32_t))
    r.fail("take of " + std::to_string(rows) + " rows longer than the message");
  if (!r.ok()) return;
  m.take.resize(rows);
  for (auto& row : m.take) row = r.get<uint32_t>();
  auto samples = r.get<uint32_t>();
  if (samples != rows) {
    r.fail("samples lists " + std::to_string(samples) + " dataset indices for " +
           std::to_string(rows) + " rows taken");
    return;
  }
  if (r.ok() && samples > r.left() / sizeof(uint32_t)) r.fail("samples longer than the message");
  if (!r.ok()) return;
  m.samples.resize(samples);
  for (auto& sample : m.samples) sample = r.get<uint32_t>();
}

void write_body(Writer& w, const Credit& m) { w.put(m.chunks); }
void read_body(Reader& r, Credit& m) {
  m.chunks = r.get<uint32_t>();
  if (m.chunks == 0 || m.chunks > 1024) r.fail("credit not in 1..1024");
}
void write_body(Writer& w, const Release& m) {
  w.put(m.seq);
  w.put(m.slot);
}
void read_body(Reader& r, Release& m) {
  m.seq = r.get<uint64_t>();
  m.slot = r.get<uint32_t>();
}
void write_body(Writer& w, const Heartbeat& m) {
  w.put(m.samples);
  w.put(m.wait_s);
  w.put_string(m.waiting_for);
}
void read_body(Reader& r, Heartbeat& m) {
  m.samples = r.get<uint64_t>();
  m.wait_s = r.get<double>();
  if (!(m.wait_s >= 0 && m.wait_s < 1e12)) r.fail("wait_s out of range");
  m.waiting_for = r.get_string();
}
void write_body(Writer&, const Goodbye&) {}
void read_body(Reader&, Goodbye&) {}
void write_body(Writer& w, const End& m) { w.put(m.epochs); }
void read_body(Reader& r, End& m) { m.epochs = r.get<uint64_t>(); }
void write_body(Writer& w, const ErrorMessage& m) { w.put_string(m.message); }
void read_body(Reader& r, ErrorMessage& m) { m.message = r.get_string(); }
void write_body(Writer& w, const Seek& m) {
  w.put(m.epoch);
  w.put(m.sample);
}
void read_body(Reader& r, Seek& m) {
  m.epoch = r.get<uint64_t>();
  m.sample = r.get<uint64_t>();
}
void write_body(Writer& w, const SeekReply& m) {
  w.put(m.epoch);
  w.put(m.sample);
  w.put(static_cast<uint8_t>(m.available ? 1 : 0));
  w.put_string(m.message);
}
void read_body(Reader& r, SeekReply& m) {
  m.epoch = r.get<uint64_t>();
  m.sample = r.get<uint64_t>();
  auto available = r.get<uint8_t>();
  if (available > 1) r.fail("unknown seek reply value " + std::to_string(available));
  m.available = available == 1;
  m.message = r.get_string();
}

void write_body(Writer& w, const HadSamples& m) {
  w.put(m.epoch);
  w.put(m.first_word);
  w.put(static_cast<uint32_t>(m.words.size()));
  for (auto word : m.words) w.put(word);
}
void read_body(Reader& r, HadSamples& m) {
  m.epoch = r.get<uint64_t>();
  m.first_word = r.get<uint64_t>();
  auto n = r.get<uint32_t>();
  if (n > kMaxHadWords) {
    r.fail("samples had in " + std::to_string(n) + " words, more than a frame's " +
           std::to_string(kMaxHadWords));
  } else if (r.ok() && n > r.left() / sizeof(uint64_t)) {
    r.fail("samples had longer than the message");
  } else if (m.first_word > (std::numeric_limits<uint64_t>::max() >> 6) - n) {
    r.fail("samples had beyond 2^64");  // dataset indices of its words would wrap
  }
  if (!r.ok()) return;
  m.words.resize(n);
  for (auto& word : m.words) word = r.get<uint64_t>();
}

template <size_t I = 0>
bool read_alternative(Reader& r, size_t index, Message& out) {
  if constexpr (I < std::variant_size_v<Message>) {
    if (index == I) {
      std::variant_alternative_t<I, Message> m;
      read_body(r, m);
      out = std::move(m);
      return true;
    }
    return read_alternative<I + 1>(r, index, out);
  }
  return false;
}

}  // namespace

std::string encode(const Message& message) {
  Writer w;
  w.put(kMagic);
  w.put(kVersion);
  w.put(static_cast<uint16_t>(message.index() + 1));
  std::visit([&](const auto& m) { write_body(w, m); }, message);
  return w.take();
}

DecodeResult decode(const void* data, size_t size) {
  DecodeResult result;
  if (size > kMaxMessageBytes) {
    result.error = "message of " + std::to_string(size) + " bytes exceeds the limit";
    return result;
  }
  Reader r(static_cast<const uint8_t*>(data), size);
  auto magic = r.get<uint32_t>();
  auto version = r.get<uint16_t>();
  auto type = r.get<uint16_t>();
  if (!r.ok()) {
    result.error = "message shorter than its header";
    return result;
  }
  if (magic != kMagic) {
    result.error = "bad magic (not a batchcast peer)";
    return result;
  }
  if (version != kVersion) {
    result.error = "protocol version " + std::to_string(version) + " (this side speaks " +
                   std::to_string(kVersion) + "); upgrade the older side";
    return result;
  }
  if (type == 0 || type > std::variant_size_v<Message>) {
    result.error = "unknown message type " + std::to_string(type);
    return result;
  }
  Message m;
  read_alternative(r, type - 1, m);
  if (r.ok() && !r.at_end()) r.fail("trailing bytes after the message");
  if (!r.ok()) {
    result.error = r.error();
    return result;
  }
  result.message = std::move(m);
  return result;
}

std::vector<HadSamples> had_parts(uint64_t epoch, const std::vector<uint64_t>& bits) {
  std::vector<HadSamples> parts;
  for (size_t first = 0; first < bits.size();) {
    if (bits[first] == 0) {
      ++first;
      continue;
    }
    size_t end = std::min(bits.size(), first + kMaxHadWords);
    while (bits[end - 1] == 0) --end;
    parts.push_back({epoch, first, {bits.begin() + first, bits.begin() + end}});
    first = end;
  }
  return parts;
}

}  // namespace batchcast::protocol
