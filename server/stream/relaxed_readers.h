// RelaxedReaders: the book of the consumers that read in relaxed order (docs/stream.md, "Order").
// A relaxed reader's epoch is its shard exactly once (this server's shard of that epoch, by
// DistributedSampler's rules) in an order the server chooses: it takes, from any chunk in the
// ring (the stream's own, or one decoded for relaxed readers), the rows it still needs this
// epoch, so that one decode serves every reader that still needs the sample, whatever their
// speeds and whenever they joined.
//
// Per reader it keeps the epoch, the samples still needed (a bit per dataset index), its own
// position (what its descriptors say) and where its scan of the ring stands; per chunk in the
// ring the dataset index of each row and who took rows of it; per sample in the ring the chunks
// (filling or retained) that hold it, so that a sample on its way to a reader is not chosen
// for it again.
//
// Resume (a trainer restarted from its state_dict): a reader resumes an epoch after the samples
// it had there, which it sends first (protocol::HadSamples); that epoch then needs the rest of
// its shard, and its position goes on from the count had. A set that is not that many samples
// of its shard is refused, naming the first fault, and the reader reads on as before.
//
// What to decode next (choose()): a reader is hungry when the rows it needs in the ring and in
// chunks being filled are fewer than it may take (its credits and the producer's lead: chunks
// in hand for its workers and, on a GPU, its uploads and the JPEG engine), and waits when they
// are fewer than its credits alone. A chunk decoded ahead (for the hungry) takes only a slot
// whose chunk no reader needs a row of; only one drawn for readers that wait may overwrite a
// chunk others still need, so that one decode stays until every reader that needs it took it,
// whatever the number of readers, unless that would hold a reader back. The
// chunk is drawn for the hungry reader that needs the fewest samples (its epoch's tail: the
// scarce one), in its own random order, the samples that other hungry readers also need first.
// So a reader alone at the head reads its shard in a random order; one behind, which needs
// samples the head already had, has them decoded with the samples the head needs too wherever
// they overlap, and alone only where they do not (its epoch's tail), instead of waiting for the
// head's next epoch.
//
// Thread-safety: none; its owner (StreamState) serialises every call. Ownership: a plain value.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "protocol/messages.h"

namespace batchcast {

class RelaxedReaders {
 public:
  // The dataset indices epoch `epoch` visits on this server (its shard).
  using Shard = std::function<std::vector<uint64_t>(uint64_t epoch)>;
  // Empty `shard`: nobody can read relaxed here (the producer cannot decode chosen samples).
  // `lead_chunks`: chunks a hungry reader may have on their way beyond its credits.
  RelaxedReaders(uint64_t dataset_size, Shard shard, uint64_t seed, uint64_t first_epoch,
                 uint64_t end_epoch, uint32_t lead_chunks);
  bool available() const { return static_cast<bool>(shard_); }

  void add(uint64_t reader, uint32_t view);  // starts at the first epoch; reads view `view`
  void remove(uint64_t reader);
  // A part of the samples it had in the epoch it resumes next.
  void had(uint64_t reader, const protocol::HadSamples& part);
  // It reads epoch `epoch` from now on, after `sample` samples: those had() sent since its last
  // resume (none for sample 0: the whole epoch). Empty, or why not (after "position
  // unavailable: "); either way the parts sent are forgotten.
  std::string resume(uint64_t reader, uint64_t epoch, uint64_t sample);
  bool reads(uint64_t reader) const { return readers_.count(reader) > 0; }
  bool empty() const { return readers_.empty(); }
  // It has read its last epoch (never with no end).
  bool done(uint64_t reader) const;

  // A chunk relaxed readers may take rows of: the dataset index of each row, and how many views
  // it is filled in (a reader of a later view cannot take it). filling(): a chunk decoded for
  // relaxed readers is being filled; filled(): it is published; retained(): a stream chunk is
  // published; gone(): its slot was reused.
  void filling(uint64_t seq, std::vector<uint64_t> samples, uint32_t views);
  void filled(uint64_t seq);
  void retained(uint64_t seq, std::vector<uint64_t> samples, uint32_t views);
  void gone(uint64_t seq);

  struct Offer {
    uint64_t seq = 0;
    std::vector<uint32_t> rows;     // ascending
    std::vector<uint32_t> samples;  // the dataset index of each row
  };
  // The oldest retained chunk filled in its view with rows it needs, of those it took no rows of
  // yet.
  std::optional<Offer> offer(uint64_t reader);
  // The position the descriptor of `offer` carries (its epoch, the samples it had before).
  protocol::ChunkPosition position(uint64_t reader, const Offer& offer) const;
  // It was sent `offer`: those rows are had (its epoch ends with its last one).
  void take(uint64_t reader, const Offer& offer);
  // Whether any reader still needs a row of chunk `seq` (its slot then takes no chunk decoded
  // ahead: StreamState::try_acquire_relaxed).
  bool wanted(uint64_t seq) const;

  // Which readers a chunk may be drawn for: the hungry (short of their credits and the lead), or
  // only those that would wait for it (short of their credits alone).
  enum class Hunger { kAhead, kWaiting };
  // The samples of the next chunk to decode for relaxed readers (at most chunk_size), or none
  // while no reader is that hungry. credits(reader): how many chunks it may be sent now.
  std::vector<uint64_t> choose(uint32_t chunk_size,
                               const std::function<uint32_t(uint64_t reader)>& credits,
                               Hunger hunger);

  uint64_t samples_taken() const { return samples_taken_; }  // rows sent to relaxed readers

 private:
  struct Reader {
    uint64_t id = 0;
    uint32_t view = 0;
    uint64_t epoch = 0;
    std::vector<uint64_t> need;  // a bit per dataset index
    uint64_t needed = 0;         // bits set
    uint64_t epoch_samples = 0;  // its shard's size
    uint64_t had = 0;            // samples had this epoch (taken, or before a resume)
    uint64_t chunks = 0;         // chunks taken this epoch
    uint64_t total = 0;          // samples taken since it attached
    uint64_t scan = 0;           // ring entries before this one have no row it needs
    std::vector<uint32_t> order;  // its epoch's shard in its own random order (choose())
    size_t cursor = 0;            // order[..cursor) were had when last looked at
    bool done = false;
    // The samples had that its next resume() starts after (had()): their epoch, a bit per
    // dataset index, and the first fault of a part (an index outside the dataset).
    std::optional<uint64_t> had_epoch;
    std::vector<uint64_t> had_bits;
    std::string had_fault;
  };
  struct Entry {
    uint64_t seq = 0;
    std::vector<uint64_t> samples;
    uint32_t views = 0;
    bool published = false;
    // Readers that took rows of it: never offered it again, so that no reader is handed one
    // decode (one augmentation draw) of a sample twice, in this epoch or the next.
    std::vector<uint64_t> takers;
  };
  // Its epoch `r.epoch` starts: its shard is needed, but for the samples of `had` (a bit per
  // dataset index, a subset of the shard), which count as had already.
  void start_epoch(Reader& r, const std::vector<uint64_t>& had = {});
  // A chunk enters the ring (filling or published).
  void add_entry(uint64_t seq, std::vector<uint64_t> samples, uint32_t views, bool published);
  static bool has(const std::vector<uint64_t>& bits, uint64_t sample) {
    return (sample >> 6) < bits.size() && ((bits[sample >> 6] >> (sample & 63)) & 1);
  }
  bool needs(const Reader& r, uint64_t sample) const { return has(r.need, sample); }
  // Why `r` cannot resume epoch `epoch` after `sample` samples, those had() kept for it; empty
  // if it can.
  std::string resume_fault(const Reader& r, uint64_t epoch, uint64_t sample) const;
  // Rows of `e` that `r` needs and may take (filled in its view, none taken yet).
  std::vector<uint32_t> rows_needed(const Reader& r, const Entry& e) const;
  // Fewer than `want` rows it needs are in the ring from its scan on, filling chunks included
  // (counted only until there are enough: this runs for every reader at every acquire).
  bool short_of(const Reader& r, uint64_t want) const;
  // Entry `entry`'s samples enter (true) or leave the ring.
  void hold(uint64_t entry, const std::vector<uint64_t>& samples, bool enter);
  // Sample `s` is in a chunk of the ring that `r` may still take rows of.
  bool on_its_way(const Reader& r, uint64_t s) const;
  // `r` may take rows of `e`: filled in its view (or still filling, for it), none taken yet.
  bool may_take(const Reader& r, const Entry& e) const;

  uint64_t dataset_size_;
  Shard shard_;
  uint64_t seed_, first_epoch_, end_epoch_;
  uint32_t lead_chunks_;
  std::map<uint64_t, Reader> readers_;
  std::map<uint64_t, Entry> ring_;      // by entry number: oldest first
  std::map<uint64_t, uint64_t> entry_;  // seq -> entry number
  uint64_t next_entry_ = 0;
  std::map<uint64_t, std::vector<uint64_t>> in_ring_;  // sample -> entries holding it
  uint64_t samples_taken_ = 0;
};

}  // namespace batchcast
