// SlotRing: the server's book of which chunk each pool slot holds and who holds it.
//
// Slot lifecycle: free -> filling (one producer writes chunk `seq`) -> published (consumers are
// sent its descriptor and each becomes a holder until it releases) -> filling again, once it
// has no holders and the server's reuse rule (StreamState) agrees. A published slot with no
// holders stays "retained" until it is reused, which is what late joiners replay. The ring
// hands out the reusable slot whose content is oldest, so retention covers the newest chunks.
//
// A ring can shrink (retire): slots at and above usable() take no new chunk; what they hold is
// still published, read and released as before, until the owner drops it (retire()).
//
// Releases are checked against the holder list: a consumer can release only a (slot, seq) it
// was sent, so a forged or repeated release is refused and cannot free another consumer's slot.
//
// Thread-safety: none; its owner (StreamState) serialises every call. Lives in the
// server's private memory, never in the shared segment, so no client can corrupt it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

namespace batchcast {

enum class SlotState : uint8_t { kFree, kFilling, kPublished };

struct SlotEntry {
  SlotState state = SlotState::kFree;
  uint64_t seq = 0;               // chunk held (valid unless kFree)
  bool delivered = false;         // sent to (or passed by) at least one consumer
  std::vector<uint64_t> holders;  // consumer ids that were sent it and have not released it
};

class SlotRing {
 public:
  explicit SlotRing(uint32_t slot_count) : slots_(slot_count), usable_(slot_count) {}

  uint32_t size() const { return static_cast<uint32_t>(slots_.size()); }
  // Slots below it take new chunks (begin_fill); at most size().
  uint32_t usable() const { return usable_; }
  void set_usable(uint32_t usable) { usable_ = usable < usable_ ? usable : usable_; }
  // A retired slot (>= usable()) that holds no chunk being filled or held: its published chunk
  // is dropped from the retained ones and the slot is free for good. False (nothing changes)
  // while it is filling or held.
  bool retire(uint32_t slot);
  const SlotEntry& slot(uint32_t i) const { return slots_[i]; }

  // Picks a free usable slot, or the published one with the oldest chunk that has no holders and that
  // `may_reuse(old_seq, delivered)` accepts, and marks it filling with `seq`. nullopt if there
  // is none. The owner decides about chunks never delivered (see StreamState's reuse rule).
  using ReuseRule = std::function<bool(uint64_t old_seq, bool delivered)>;
  // `evicted`, if given, is set to the published chunk the slot held (nullopt for a free slot).
  std::optional<uint32_t> begin_fill(uint64_t seq, const ReuseRule& may_reuse,
                                     std::optional<uint64_t>* evicted = nullptr);
  // filling -> published.
  void finish_fill(uint32_t slot);

  // The slot holding published chunk `seq`, if it is still retained.
  std::optional<uint32_t> find_published(uint64_t seq) const;
  // The oldest retained chunk with seq >= `from`, if any.
  std::optional<uint64_t> oldest_published_from(uint64_t from) const;
  const std::map<uint64_t, uint32_t>& published() const { return by_seq_; }

  void add_holder(uint32_t slot, uint64_t consumer);
  // A consumer passed the chunk by choice (late_join=next_epoch skips to an epoch start): it
  // counts as delivered, so the ring may reuse it once no one else needs it.
  void mark_passed(uint32_t slot) { slots_[slot].delivered = true; }
  // False (and nothing changes) unless `consumer` holds chunk `seq` in `slot`.
  bool release(uint32_t slot, uint64_t seq, uint64_t consumer);
  // Drops every hold of `consumer`; returns how many it had.
  size_t release_all(uint64_t consumer);

  // How many chunk holds `consumer` has.
  size_t held_by(uint64_t consumer) const;

  // Slots that cannot take a new chunk now: filling, held, or published but never delivered.
  uint32_t occupied() const;
  // Slots being filled.
  uint32_t filling() const;

 private:
  std::vector<SlotEntry> slots_;
  uint32_t usable_;
  std::map<uint64_t, uint32_t> by_seq_;  // published chunks still retained: seq -> slot
};

}  // namespace batchcast
