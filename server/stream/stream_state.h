// StreamState: the stream semantics (docs/stream.md) as a pure state machine: which chunk
// each consumer is sent next, when a slot may be refilled, when the stream starts and ends.
//
// It owns the slot book (SlotRing), the consumers (ConsumerRegistry), the descriptors of the
// retained chunks, the in-order publish queue, every consumer's cursor and the counters; it does
// no I/O, reads no clock, starts no thread and takes no lock. Time comes in as `now` (seconds on
// any monotonic clock), events come in as calls, and the two things it needs from the world are
// injected: `send` (a refused send stops delivery to that consumer until the next tick) and
// `alive` (is this local pid still running). Its only other output is the spdlog lines that
// name attaches, departures and dropped messages. StreamHost is the I/O shell around it; tests
// drive it directly with their own clock, liveness and outbox.
//
// Rules (each is unit-tested in tests/cpp/server/stream_state_*_test.cpp):
// - Chunks are published in seq order whatever the order of publish() calls.
// - Nothing is delivered before `min_consumers` attached; nothing undelivered is overwritten.
// - Lead: with rules.lead_chunks, the producer fills at most that many chunks nobody was sent
//   yet; the rest of the ring is the window that lets readers of different speeds drift apart.
//   Waiting there is the producer's blocked time but never a stall: nobody holds the stream.
// - Reuse: a slot is refilled only if nobody holds its chunk, no active consumer's cursor is at
//   or before it, and it was delivered to someone or some consumer's cursor is past it. Under
//   stall_policy=skip a consumer that asked for nothing for stall_timeout stops pinning cursors.
// - Decouple (stall_policy=decouple, producers that regenerate): a consumer that holds the
//   stream back (the producer waits for a slot with fewer than two chunks in hand, another
//   consumer was sent every published chunk, and it pins published chunks it was not
//   sent yet, or keeps the oldest chunk still held that another reader released: lockstep on a
//   small ring) for its stall bound (on a ring sized by memory, or has lagged more than the lead
//   behind another reader that long) stops pinning: it reads from its position on in private chunks
//   (nothing lost) and merges back once it has caught up: the stream went on a ring's worth without
//   it, and it reached a chunk the stream still holds within half the room the stream has ahead of
//   its slowest reader. Without regeneration it waits, as under stall_policy=wait, and says so
//   once.
// - Catch up: a consumer decoupled while it had stopped (warming up, validating) whose own pace
//   (heartbeats: samples per second not waited) is well above the stream's while it waits for
//   its private chunks is caught up first, once per decoupling: the producer fills no stream
//   chunk until it merged (at most its gap at the producer's pace plus its bound; a gap of more
//   than 10 s stays private).
// - Stalls are said: a stream that has not moved for stall_timeout since it started (the
//   producer's wait for min_consumers is none) is logged once, naming each consumer's pid, name,
//   chunks held and position; every other consumer's heartbeat says what holds its data back
//   (min_consumers not met, a named consumer).
// - Dropped messages are said: malformed ones, forged releases, a stranger's; not what a
//   consumer sent before the End that answered its Goodbye reached it.
// - Late join: within the retained chunks that run without a gap up to the newest, a new
//   consumer starts at the first epoch start, else at the first chunk; late_join=next_epoch
//   then skips to an epoch start. On a producer that regenerates, a replay joiner that would
//   start mid-epoch seeks to that epoch's start instead (a whole epoch from its first batch).
// - Seek (consumer -> (epoch, sample)): a retained chunk holding it becomes the cursor; a
//   position at most the next epoch ahead of the stream is waited for (pinning nothing); any
//   other position is regenerated (PrivateStreams: behind by at most an epoch, the consumer
//   pins a shared chunk catch_up_slots() past the oldest retained and merges there; further,
//   private for good) or answered "position unavailable". On a producer that regenerates, the
//   stream's chunks pin at most the ring less catch_up_slots() (rings of 8 slots and more): a
//   catch-up always finds slots, even while the other consumers do not read; consumers release
//   private chunks as they arrive, so any number of catch-ups at once share those slots.
// - Waited chunk: the head is waited for when a consumer level with it has taken every chunk
//   it was sent (waited_chunk).
// - Skip: a chunk no attached consumer wants (all sought past it) is not filled (wanted/skip).
// - Liveness: local consumers by `alive(pid)` every 0.2 s, remote ones by heartbeat timeout.
// - End to every consumer after finish(), and to a consumer in answer to its Goodbye (nothing
//   follows); fail() sends the error to everyone, also later joiners, and delivers no more chunks.
//
// - Shrink (shrink_ring): no chunk is filled in a retired slot; the lead, the catch-up reserve,
//   the decouple window and "every slot pinned" count the usable slots; descriptors are checked
//   against the whole ring. A retired slot is handed over (take_retired_slots) once its chunk may
//   go by the reuse rule, never while it is filled or held, and its chunk is no longer replayed.
// - Views: each view (add_view) has its own pool, with the ring's usable slots when it is
//   added; a stream chunk is in every view that existed when it was acquired, a private chunk
//   only in the view of the consumer it is made for (Fill::view; nobody else is sent it). A consumer reads one view (Hello.view,
//   mapped by the injected ResolveView; a view refused there is answered with an ErrorMessage),
//   is welcomed with that view's pool and sent that view's tensors; the chunks acquired before
//   its view existed count, for it, as chunks the ring no longer holds (regenerated when the
//   producer can).
// - Order (Hello.order, rules.default_order; docs/stream.md, Order): a relaxed reader pins
//   nothing and holds nobody back; it is sent the rows of any retained chunk of its view that it
//   still needs this epoch (RelaxedReaders), with its own position and each row's dataset index;
//   acquire_private also hands out chunks decoded for relaxed readers that would otherwise wait;
//   while only relaxed readers read, the stream's order waits, and once they all read their last
//   epoch it is finished. A relaxed reader's Seek resumes an epoch after the samples it had there
//   (the HadSamples before it): a set that is not that many samples of its shard is answered
//   "position unavailable", naming the fault, and it reads on as before. Its Welcome says which
//   order it is served in.
//
// The seek rules (on_seek, the private and sought deliveries, wanted) are defined in
// stream_seek.cpp, the slots (acquire, reuse, lead, reserve) in stream_slots.cpp, the stalls in
// stream_stalls.cpp, the catch-ups in stream_catch_up.cpp, the views in stream_views.cpp, the
// rest in stream_state.cpp.
//
// Thread-safety: none; the owner serialises every call. Lifetime: the injected functions must
// outlive it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "protocol/messages.h"
#include "server/stream/consumer_registry.h"
#include "server/stream/private_streams.h"
#include "server/stream/relaxed_readers.h"
#include "server/stream/slot_ring.h"
#include "server/stream/stream_rules.h"

namespace batchcast {

class StreamState {
 public:
  // False: the message was not taken (peer gone, queue full).
  using Send = std::function<bool(const std::string& identity, const protocol::Message& message)>;
  using Alive = std::function<bool(pid_t pid)>;
  // A consumer's Hello.view -> the view it reads (it may call add_view first), or the message
  // refusing it. Empty: only "" (view 0) is served.
  struct ViewChoice {
    uint32_t view = 0;
    std::string error;
  };
  using ResolveView = std::function<ViewChoice(const std::string& view)>;

  StreamState(StreamRules rules, Send send, Alive alive, ResolveView resolve_view = {});

  // A view's tensors in its slot for a chunk of `sample_count` samples (what its consumers'
  // descriptors carry instead of the producer's).
  using ViewSpecs = std::function<std::vector<protocol::TensorSpec>(uint32_t sample_count)>;
  // A view more (index returned; view 0 is the pool of rules.welcome): its pool's Welcome and
  // its tensors. Chunks acquired from now on carry it.
  uint32_t add_view(protocol::Welcome welcome, ViewSpecs specs);
  uint32_t view_count() const { return static_cast<uint32_t>(views_.size()) + 1; }

  // The ring takes new chunks only in its first `usable` slots from now on (never grows): a
  // view added to a stream with a memory budget has a pool of that many slots. Chunks in the
  // retired slots are still published, sent and released as before.
  void shrink_ring(uint32_t usable);
  // Slots that take new chunks: rules.slot_count until shrink_ring().
  uint32_t usable_slots() const { return ring_.usable(); }
  // The retired slots whose chunk may now go (the reuse rule) or that hold none, each once: the
  // chunk is no longer retained (no late joiner replays it) and the owner may release the
  // slot's memory. Never a slot being filled or held.
  std::vector<uint32_t> take_retired_slots(double now);

  // Producer side. A slot for chunk `seq` to be filled, or nullopt while the reuse rule keeps
  // every slot (time spent refused counts as producer_blocked_s).
  struct Fill {
    uint64_t seq;
    uint32_t slot;
    std::optional<ChunkAddress> regenerate;  // a private chunk: fill this chunk of the stream
    // A private chunk: the one view to fill, its consumer's. nullopt: a stream chunk, filled in
    // every view (view_count() at acquire).
    std::optional<uint32_t> view;
    // A relaxed chunk (protocol::is_relaxed_seq): the dataset index of each row to decode.
    std::vector<uint64_t> samples;
  };
  // The stream's next chunk; nullopt after finish(), or while every slot is kept.
  std::optional<Fill> try_acquire(double now);
  // A chunk to regenerate for a consumer catching up; nullopt while none is asked for or every
  // slot is kept. Only producers with rules.regenerates call it.
  std::optional<Fill> try_acquire_private(double now);
  // Chunk `seq` is filled; a stream chunk goes out once every earlier chunk did, a private one
  // to its consumer in that consumer's order, a relaxed one to the relaxed readers that need
  // rows of it. `samples`: the dataset index of each row (what relaxed readers take rows by; a
  // chunk without them is read in exact order only). An invalid chunk (a producer bug) fails
  // the stream.
  void publish(uint64_t seq, uint32_t slot, protocol::ChunkPosition position,
               std::vector<protocol::TensorSpec> tensors, std::vector<uint64_t> samples = {});
  // Whether any attached consumer may still be sent a chunk at `position` (before the start
  // or below min_consumers: yes). Nobody does when every consumer sought past it (a break)
  // or reads private chunks for good.
  bool wanted(const protocol::ChunkPosition& position) const;
  // The stream's next chunk, at `position`, is skipped instead of filled: it takes its number
  // and its samples in stream positions, no slot, and nobody is sent it.
  void skip(const protocol::ChunkPosition& position);
  void finish();                          // no chunk follows the ones acquired so far
  void fail(const std::string& message);  // the first failure wins
  void set_epoch_samples(uint64_t samples) { rules_.epoch_samples = samples; }

  // Consumer side: one frame from `identity` (malformed or unexpected ones are counted and
  // dropped), or a frame the transport already rejected.
  void receive(const std::string& identity, const void* data, size_t size, double now);
  void drop_frame() { counters_.messages_dropped++; }
  // Sends what is due: errors, descriptors, End, heartbeats; checks liveness.
  void tick(double now);

  // The stream chunk a consumer waits for: the oldest not yet published (the stream's head),
  // when some consumer reading the stream has taken every chunk it was sent (its credits are back
  // at its prefetch) and is level with it. nullopt while nobody does, before the stream starts,
  // after its last chunk and once it failed. A producer that can make a chunk faster another way
  // uses it for that chunk (server/produce/decode_split.h).
  std::optional<uint64_t> waited_chunk() const;
  // Rows sent to consumers so far, in every order: what the stream's readers were given, their
  // prefetch included (a producer that weighs two ways of decoding by what they bring its
  // readers reads it).
  uint64_t samples_sent() const { return counters_.samples_sent; }
  bool failed() const { return !failure_.empty(); }
  // finish() was called, or only relaxed readers ever read and every one has read its last
  // epoch: nothing else will read the stream's order (try_acquire then finishes it).
  bool finished() const { return finished_; }
  const std::string& failure() const { return failure_; }  // empty unless failed()
  // finish() was called, min_consumers attached, and every consumer was sent End (or left).
  bool all_ended() const;
  StreamStats stats() const;
  // Producer time blocked up to `now`, a block still going on included (stats() adds a block
  // when it ends: a rate taken over a tick would put a whole long block into one tick).
  double producer_blocked_s(double now) const {
    return counters_.producer_blocked_s + (blocked_since_ ? now - *blocked_since_ : 0.0) +
           (ahead_since_ ? now - *ahead_since_ : 0.0);
  }
  uint64_t consumers_now() const { return consumers_.size(); }
  // Attached and not closing: a consumer that said Goodbye while its user still holds batches
  // stays in consumers_now() (its slots stay pinned) but no longer reads.
  uint64_t consumers_reading() const { return consumers_.reading(); }
  uint64_t consumers_ever() const { return consumers_.ever(); }

 private:
  void on_hello(const std::string& identity, const protocol::Hello& hello, double now);
  // Moves `c`'s cursor to `target` (docs/stream.md, "Seek"); `reply`: answer with a SeekReply.
  void on_seek(ConsumerRecord& c, protocol::Seek target, bool reply);
  // One step of delivery to a consumer with a private stream (or a pending seek): true when
  // nothing more can be sent to it now, false to look at it again.
  bool deliver_private(ConsumerRecord& c);
  // The oldest chunk being filled for relaxed readers while one of them had credit and nothing to
  // take at its last delivery (it waits): what waited_chunk() names when no stream chunk is.
  std::optional<uint64_t> waited_relaxed_chunk() const;
  // A relaxed chunk is filled: kept for the relaxed readers that need rows of it.
  void publish_relaxed(uint64_t seq, uint32_t slot, const protocol::ChunkPosition& position,
                       std::vector<protocol::TensorSpec> tensors);
  // The same for a relaxed reader: the oldest chunk in the ring with rows it needs, or End.
  bool deliver_relaxed(ConsumerRecord& c);
  // A chunk for the relaxed readers that would otherwise wait (RelaxedReaders::choose).
  std::optional<Fill> try_acquire_relaxed(double now);
  // An attached consumer reads the stream in exact order (it is what the stream is made for).
  bool exact_reader() const;
  // A relaxed reader still reads (not done, not leaving).
  bool relaxed_reading() const;
  // The views stream chunk `seq` was filled in (those that existed when it was acquired).
  uint32_t views_at(uint64_t seq) const;
  // Its slot was reused or retired: the chunk is gone from the retained ones.
  void forget_chunk(uint64_t seq) {
    descriptors_.erase(seq);
    relaxed_.gone(seq);
  }
  bool deliver_sought(ConsumerRecord& c);
  // Sends chunk `d` to `c` with the tensors of c's view; false if the send was refused.
  bool send_chunk(const ConsumerRecord& c, const protocol::ChunkDescriptor& d);
  // The first stream chunk c's view is in, and the first private one.
  uint64_t view_since(const ConsumerRecord& c) const {
    return c.view ? views_[c.view - 1].since_seq : 0;
  }
  // tail_begin() for `c`: the retained chunks that hold its view.
  uint64_t tail_for(const ConsumerRecord& c) const { return std::max(tail_begin(), view_since(c)); }
  void deliver();
  void check_liveness(double now);
  // Holding back, decoupling, the stall log and what each consumer is told it waits for.
  void watch_stalls(double now);
  // The consumers holding the stream back now: someone waits for a slot (the producer, some
  // other consumer having been sent every published chunk; or a private chunk asked for, every
  // slot holding a stream chunk that may not be reused), and they pin published chunks not
  // sent to them.
  std::vector<uint64_t> holding_back(double now) const;
  // A consumer reading the shared stream has been sent every published chunk: it waits for the
  // producer.
  bool reader_waits(double now) const;
  // A reader waits (reader_waits) and the stream is not finished, while the producer fills fewer
  // than two chunks (the stream's or private ones): with more in hand, whoever waits for it waits
  // for its speed, and nobody holds the stream back.
  bool reader_waits_for_a_slot(double now) const;
  // One debug line a second (SPDLOG_LEVEL=debug): what each reader holds and owes the stream,
  // so that a run where nobody is decoupled shows why.
  void trace_stalls(double now);
  // A private chunk was asked for and every slot holds a stream chunk that may not be reused:
  // its consumer (resumed, catching up, decoupled) waits for the stream's readers.
  bool private_chunk_waits(double now) const;
  void decouple(ConsumerRecord& c, double now);
  // A decoupled consumer whose next chunk the stream still holds merges there; true if it did.
  bool try_rejoin(ConsumerRecord& c, PrivateStreams::Stream& p);
  // The stream has gone a ring's worth of chunks on since `p`'s consumer was decoupled: until
  // then its next chunk is still there because it held the stream back, and it may not merge.
  bool went_on_without(const PrivateStreams::Stream& p) const {
    return next_publish_seq_ >= p.decoupled_at + usable_slots();
  }
  // Every pace window: each consumer's own pace and the stream's and producer's (samples/s).
  void watch_paces(double now);
  // Chooses (or lets go) the decoupled consumer the stream waits for while it catches up.
  void watch_catch_up(double now);
  // Whether `c` pins the stream's chunks at and after its cursor.
  bool pins_stream(const ConsumerRecord& c, double now) const;
  // It reads the shared stream (not private chunks) and pins it.
  bool reads_stream(const ConsumerRecord& c, double now) const;
  double stall_bound(const ConsumerRecord& c) const {
    return c.stall_timeout_s > 0 ? c.stall_timeout_s : rules_.stall_timeout_s;
  }
  // The position of the published chunk `c` reads next from the shared stream; null while it
  // reads private chunks, seeks, or is level with the stream's head.
  const protocol::ChunkPosition* next_shared_position(const ConsumerRecord& c) const;
  uint64_t samples_behind(const ConsumerRecord& c) const;
  // "consumer 2 'name' (pid 123)", then with `detail` what it holds and where it is.
  std::string label(const ConsumerRecord& c, bool detail) const;
  void drop_consumer(uint64_t id, const char* why);
  bool may_reuse(uint64_t old_seq, bool delivered, double now) const;
  struct SlotCount {
    uint32_t reusable = 0;       // free, or published and refillable now (may_reuse)
    uint32_t pinned_stream = 0;  // the stream's chunks that are not: filling, held or pinned
  };
  SlotCount count_slots(double now) const;
  // The stream's chunks filling, or published and sent to nobody yet, from the most advanced
  // reader's next chunk on (rules.lead_chunks).
  uint32_t chunks_ahead() const;
  // Slots kept for the private chunks of consumers catching up: max(3, a quarter ring), at most
  // the ring less one.
  uint32_t catch_up_slots() const;
  // First seq of the retained chunks that run without a gap up to the newest published one.
  uint64_t tail_begin() const;
  void publish_ready();  // publishes the chunks whose turn it is, in seq order
  // Where the stream's next chunk will sit: after the newest published one.
  protocol::Seek stream_next() const;
  uint64_t chunks_per_epoch() const;  // 0 unless the producer regenerates and both are known
  // Where stream chunk `seq` (not published yet) will sit, and the samples before it in the
  // stream: counted on from stream_next() (stream chunks are numbered consecutively, skipped
  // ones too). Needs chunks_per_epoch().
  std::pair<ChunkAddress, uint64_t> address_ahead(uint64_t seq) const;
  uint64_t end_epoch() const {  // first epoch not served (0: unbounded)
    return rules_.epochs ? rules_.welcome.first_epoch + rules_.epochs : 0;
  }
  // Private chunks nobody will be sent: their slots may be reused.
  void abandon(const std::vector<uint32_t>& slots) {
    for (uint32_t slot : slots) ring_.mark_passed(slot);
  }

  StreamRules rules_;
  Send send_;
  Alive alive_;
  ResolveView resolve_view_;
  struct View {
    protocol::Welcome welcome;
    ViewSpecs specs;
    uint64_t since_seq;  // first stream chunk acquired with it
  };
  std::vector<View> views_;  // views 1, 2, ...
  SlotRing ring_;
  std::vector<bool> retired_taken_;  // by slot: handed over by take_retired_slots()
  ConsumerRegistry consumers_;
  uint64_t next_acquire_seq_ = 0;
  uint64_t next_publish_seq_ = 0;  // chunks below are published (or reused)
  uint64_t stream_position_ = 0;   // samples in published chunks
  uint64_t regenerated_samples_ = 0;  // samples in private chunks filled
  // Paces over the last window (watch_paces), samples/s: the stream's published chunks, and
  // everything the producer filled (the stream's and private chunks).
  double stream_pace_ = 0, producer_pace_ = 0;
  struct {
    double t = -1;
    uint64_t published = 0, regenerated = 0;
  } pace_mark_;
  // The decoupled consumer the stream waits for while it catches up (watch_catch_up), and
  // until when at most.
  std::optional<uint64_t> catching_up_;
  double catch_up_until_ = 0;
  struct Filled {
    uint32_t slot;
    protocol::ChunkPosition position;
    std::vector<protocol::TensorSpec> tensors;
    bool skipped;  // skip(): no slot, no descriptor
    std::vector<uint64_t> samples;
  };
  std::map<uint64_t, Filled> ready_;                           // waiting for their turn
  std::map<uint64_t, protocol::ChunkDescriptor> descriptors_;  // by seq, for retained chunks
  std::optional<protocol::ChunkPosition> newest_;              // of the last chunk published
  PrivateStreams private_;
  RelaxedReaders relaxed_;
  uint64_t next_relaxed_seq_ = protocol::kRelaxedSeqBase;
  bool said_exact_only_ = false;  // a relaxed reader served exact here: said once
  bool exact_ever_ = false;       // an exact reader attached once
  bool relaxed_ever_ = false;     // a relaxed reader attached once
  bool started_ = false;  // min_consumers reached
  bool finished_ = false;
  uint64_t end_seq_ = 0;
  std::string failure_;
  std::optional<double> blocked_since_;  // the producer's first acquire refused a slot
  std::optional<double> ahead_since_;    // ... refused for running rules.lead_chunks ahead
  bool stall_logged_ = false;            // this block of the producer was logged
  bool said_cannot_decouple_ = false;    // decouple without regeneration: said once
  std::optional<double> last_watch_;     // watch_stalls' previous call
  std::vector<uint64_t> holding_;        // holding the stream back, as of the last tick
  // Those holding it back when the producer last waited for a slot, and the chunk it waited to
  // fill: until that chunk is published, a reader waiting for it still waits for them.
  std::vector<uint64_t> waited_for_;
  uint64_t waited_for_seq_ = 0;
  std::string waiting_for_;  // told the others in heartbeats (watch_stalls)
  double next_liveness_ = 0, next_heartbeat_ = 0, next_stall_trace_ = 0;
  StreamStats counters_;
  std::vector<StreamStats::Consumer> departed_;
  // The identities of departed consumers that had been sent End, the newest last (bounded):
  // what they sent before End reached them is no stranger's message.
  std::deque<std::string> ended_identities_;
};

}  // namespace batchcast
