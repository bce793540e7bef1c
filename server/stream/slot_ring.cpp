#include "server/stream/slot_ring.h"

#include <algorithm>

namespace batchcast {

std::optional<uint32_t> SlotRing::begin_fill(uint64_t seq, const ReuseRule& may_reuse,
                                             std::optional<uint64_t>* evicted) {
  std::optional<uint32_t> chosen;
  for (uint32_t i = 0; i < usable_; ++i) {
    if (slots_[i].state == SlotState::kFree) {
      chosen = i;
      break;
    }
  }
  if (!chosen) {
    // by_seq_ is ordered by seq, so the first acceptable entry is the oldest content.
    for (const auto& [old_seq, slot] : by_seq_) {
      const auto& s = slots_[slot];
      if (slot < usable_ && s.holders.empty() && may_reuse(old_seq, s.delivered)) {
        chosen = slot;
        break;
      }
    }
  }
  if (!chosen) return std::nullopt;
  auto& s = slots_[*chosen];
  if (evicted) evicted->reset();
  if (s.state == SlotState::kPublished) {
    by_seq_.erase(s.seq);
    if (evicted) *evicted = s.seq;
  }
  s.state = SlotState::kFilling;
  s.seq = seq;
  s.delivered = false;
  s.holders.clear();
  return chosen;
}

bool SlotRing::retire(uint32_t slot) {
  auto& s = slots_[slot];
  if (slot < usable_ || s.state == SlotState::kFilling || !s.holders.empty()) return false;
  if (s.state == SlotState::kPublished) by_seq_.erase(s.seq);
  s.state = SlotState::kFree;
  s.delivered = false;
  return true;
}

void SlotRing::finish_fill(uint32_t slot) {
  auto& s = slots_[slot];
  s.state = SlotState::kPublished;
  by_seq_[s.seq] = slot;
}

std::optional<uint32_t> SlotRing::find_published(uint64_t seq) const {
  auto it = by_seq_.find(seq);
  if (it == by_seq_.end()) return std::nullopt;
  return it->second;
}

std::optional<uint64_t> SlotRing::oldest_published_from(uint64_t from) const {
  auto it = by_seq_.lower_bound(from);
  if (it == by_seq_.end()) return std::nullopt;
  return it->first;
}

void SlotRing::add_holder(uint32_t slot, uint64_t consumer) {
  slots_[slot].holders.push_back(consumer);
  slots_[slot].delivered = true;
}

bool SlotRing::release(uint32_t slot, uint64_t seq, uint64_t consumer) {
  if (slot >= slots_.size()) return false;
  auto& s = slots_[slot];
  if (s.state != SlotState::kPublished || s.seq != seq) return false;
  auto it = std::find(s.holders.begin(), s.holders.end(), consumer);
  if (it == s.holders.end()) return false;
  s.holders.erase(it);
  return true;
}

size_t SlotRing::release_all(uint64_t consumer) {
  size_t n = 0;
  for (auto& s : slots_) {
    auto before = s.holders.size();
    s.holders.erase(std::remove(s.holders.begin(), s.holders.end(), consumer), s.holders.end());
    n += before - s.holders.size();
  }
  return n;
}

size_t SlotRing::held_by(uint64_t consumer) const {
  size_t n = 0;
  for (const auto& s : slots_) n += std::count(s.holders.begin(), s.holders.end(), consumer);
  return n;
}

uint32_t SlotRing::filling() const {
  return static_cast<uint32_t>(std::count_if(slots_.begin(), slots_.end(), [](const SlotEntry& s) {
    return s.state == SlotState::kFilling;
  }));
}

uint32_t SlotRing::occupied() const {
  uint32_t n = 0;
  for (const auto& s : slots_) {
    if (s.state == SlotState::kFilling ||
        (s.state == SlotState::kPublished && (!s.holders.empty() || !s.delivered)))
      ++n;
  }
  return n;
}

}  // namespace batchcast
