#include "server/stream/private_streams.h"

#include <algorithm>

namespace batchcast {

std::vector<uint32_t> PrivateStreams::start(uint64_t consumer, ChunkAddress from,
                                            std::optional<ChunkAddress> until,
                                            uint64_t stream_position, bool rejoin) {
  auto abandoned = stop(consumer);
  Stream& s = streams_[consumer];
  s.generation = ++generations_;
  s.next_request = s.next_send = from;
  s.until = until;
  s.rejoin = rejoin;
  s.stream_position = stream_position;
  return abandoned;
}

std::vector<uint32_t> PrivateStreams::stop(uint64_t consumer) {
  std::vector<uint32_t> abandoned;
  auto it = streams_.find(consumer);
  if (it == streams_.end()) return abandoned;
  for (const auto& [address, d] : it->second.ready) {
    abandoned.push_back(d.slot);
    owners_.erase(d.seq);
  }
  streams_.erase(it);
  requests_.erase(std::remove_if(requests_.begin(), requests_.end(),
                                 [&](const Request& r) { return r.consumer == consumer; }),
                  requests_.end());
  return abandoned;
}

PrivateStreams::Stream* PrivateStreams::find(uint64_t consumer) {
  auto it = streams_.find(consumer);
  return it == streams_.end() ? nullptr : &it->second;
}

const PrivateStreams::Stream* PrivateStreams::find(uint64_t consumer) const {
  auto it = streams_.find(consumer);
  return it == streams_.end() ? nullptr : &it->second;
}

bool PrivateStreams::catching_up() const {
  return std::any_of(streams_.begin(), streams_.end(),
                     [](const auto& entry) { return entry.second.until.has_value(); });
}

void PrivateStreams::top_up(uint64_t consumer, uint32_t window, uint64_t chunks_per_epoch,
                            uint64_t end_epoch) {
  Stream* s = find(consumer);
  if (!s || chunks_per_epoch == 0) return;
  while (s->requested + s->ready.size() < window && (!s->until || s->next_request < *s->until) &&
         (end_epoch == 0 || s->next_request.epoch < end_epoch)) {
    requests_.push_back({consumer, s->generation, s->next_request});
    s->next_request = next_chunk(s->next_request, chunks_per_epoch);
    s->requested++;
  }
}

std::optional<PrivateStreams::Request> PrivateStreams::next_request() const {
  if (requests_.empty()) return std::nullopt;
  return requests_.front();
}

void PrivateStreams::take_request(uint64_t seq) {
  owners_[seq] = requests_.front();
  requests_.pop_front();
  ++next_seq_;
}

bool PrivateStreams::filled(uint64_t seq, protocol::ChunkDescriptor descriptor) {
  auto owner = owners_.find(seq);
  if (owner == owners_.end()) return false;
  const Request& r = owner->second;
  Stream* s = find(r.consumer);
  if (!s || s->generation != r.generation) {
    owners_.erase(owner);
    return false;
  }
  s->requested--;
  s->ready[r.chunk] = std::move(descriptor);
  return true;
}

std::optional<uint64_t> PrivateStreams::owner(uint64_t seq) const {
  auto it = owners_.find(seq);
  if (it == owners_.end()) return std::nullopt;
  return it->second.consumer;
}

}  // namespace batchcast
