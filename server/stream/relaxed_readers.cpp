#include "server/stream/relaxed_readers.h"

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "common/random.h"

namespace batchcast {

namespace {
// choose() looks at this many candidates per row of the chunk for the rows others need too.
constexpr uint32_t kCandidatesPerRow = 4;
}  // namespace

RelaxedReaders::RelaxedReaders(uint64_t dataset_size, Shard shard, uint64_t seed,
                               uint64_t first_epoch, uint64_t end_epoch, uint32_t lead_chunks)
    : dataset_size_(dataset_size),
      shard_(std::move(shard)),
      seed_(seed),
      first_epoch_(first_epoch),
      end_epoch_(end_epoch),
      lead_chunks_(lead_chunks) {
  if (shard_ && dataset_size_ >= (uint64_t{1} << 32))
    throw Error("relaxed order serves datasets of fewer than 2^32 samples");
}

void RelaxedReaders::add(uint64_t reader, uint32_t view) {
  Reader r;
  r.id = reader;
  r.view = view;
  r.epoch = first_epoch_;
  start_epoch(r);
  readers_[reader] = std::move(r);
}

void RelaxedReaders::remove(uint64_t reader) { readers_.erase(reader); }

void RelaxedReaders::had(uint64_t reader, const protocol::HadSamples& part) {
  Reader& r = readers_.at(reader);
  if (r.had_epoch && *r.had_epoch != part.epoch && r.had_fault.empty())
    r.had_fault = "the samples had are of epochs " + std::to_string(*r.had_epoch) + " and " +
                  std::to_string(part.epoch) + ", not of one";
  r.had_epoch = part.epoch;
  const uint64_t words = (dataset_size_ + 63) / 64;
  r.had_bits.resize(words, 0);
  for (size_t k = 0; k < part.words.size(); ++k) {
    const uint64_t at = part.first_word + k;  // decode() keeps 64 * at + 63 within 64 bits
    uint64_t word = part.words[k];
    if (at < words) {
      const uint64_t inside = at + 1 < words || dataset_size_ % 64 == 0
                                  ? ~uint64_t{0}
                                  : (uint64_t{1} << (dataset_size_ % 64)) - 1;
      r.had_bits[at] |= word & inside;
      word &= ~inside;
    }
    if (word && r.had_fault.empty())
      r.had_fault = "sample " +
                    std::to_string(at * 64 + static_cast<uint64_t>(__builtin_ctzll(word))) +
                    " had is outside the dataset of " + std::to_string(dataset_size_) + " samples";
  }
}

std::string RelaxedReaders::resume_fault(const Reader& r, uint64_t epoch, uint64_t sample) const {
  if (!r.had_fault.empty()) return r.had_fault;
  if (!r.had_epoch && sample != 0)
    return "a relaxed reader resumes inside an epoch only after the samples it had there (what "
           "a relaxed Loader's state_dict() keeps), and none came; pass load_state_dict() such a "
           "state, or seek to sample 0 to read epoch " +
           std::to_string(epoch) + " whole";
  if (r.had_epoch && *r.had_epoch != epoch)
    return "the samples had are of epoch " + std::to_string(*r.had_epoch) +
           ", the position of epoch " + std::to_string(epoch);
  uint64_t count = 0;
  for (uint64_t word : r.had_bits) count += static_cast<uint64_t>(__builtin_popcountll(word));
  if (count != sample)
    return "the state says " + std::to_string(sample) + " samples of epoch " +
           std::to_string(epoch) + " were had but lists " + std::to_string(count);
  if (count == 0) return "";
  std::vector<uint64_t> shard((dataset_size_ + 63) / 64, 0);
  for (uint64_t s : shard_(epoch))
    if (s < dataset_size_) shard[s >> 6] |= uint64_t{1} << (s & 63);
  for (size_t k = 0; k < r.had_bits.size(); ++k) {
    if (const uint64_t outside = r.had_bits[k] & ~shard[k])
      return "sample " + std::to_string(k * 64 + static_cast<uint64_t>(__builtin_ctzll(outside))) +
             " had is not in this server's shard of epoch " + std::to_string(epoch) +
             " (a state of another rank, dataset or seed)";
  }
  return "";
}

std::string RelaxedReaders::resume(uint64_t reader, uint64_t epoch, uint64_t sample) {
  Reader& r = readers_.at(reader);
  std::string fault = resume_fault(r, epoch, sample);
  std::vector<uint64_t> had = std::move(r.had_bits);
  r.had_bits.clear();
  r.had_epoch.reset();
  r.had_fault.clear();
  if (!fault.empty()) return fault;
  r.epoch = epoch;
  r.done = false;
  start_epoch(r, had);
  if (r.needed == 0 && !r.done) {  // it had the whole epoch: the next one follows
    ++r.epoch;
    start_epoch(r);
  }
  return "";
}

bool RelaxedReaders::done(uint64_t reader) const {
  auto it = readers_.find(reader);
  return it != readers_.end() && it->second.done;
}

void RelaxedReaders::start_epoch(Reader& r, const std::vector<uint64_t>& had) {
  r.need.assign((dataset_size_ + 63) / 64, 0);
  r.needed = r.had = r.chunks = 0;
  r.order.clear();
  r.cursor = 0;
  r.scan = ring_.empty() ? next_entry_ : ring_.begin()->first;
  if (end_epoch_ && r.epoch >= end_epoch_) {
    r.done = true;
    return;
  }
  for (uint64_t s : shard_(r.epoch)) {
    if (s >= dataset_size_ || needs(r, s) || has(had, s)) continue;
    r.need[s >> 6] |= uint64_t{1} << (s & 63);
    r.order.push_back(static_cast<uint32_t>(s));
  }
  for (uint64_t word : had) r.had += static_cast<uint64_t>(__builtin_popcountll(word));
  r.needed = r.order.size();
  r.epoch_samples = r.needed + r.had;
  SampleRng rng(seed_, r.epoch, hash_combine(r.id, 0x7e1a8edull));
  shuffle(r.order, rng);
}

void RelaxedReaders::hold(uint64_t entry, const std::vector<uint64_t>& samples, bool enter) {
  for (uint64_t s : samples) {
    auto& entries = in_ring_[s];
    if (enter) {
      entries.push_back(entry);
    } else {
      entries.erase(std::remove(entries.begin(), entries.end(), entry), entries.end());
      if (entries.empty()) in_ring_.erase(s);
    }
  }
}

bool RelaxedReaders::may_take(const Reader& r, const Entry& e) const {
  return r.view < e.views && std::find(e.takers.begin(), e.takers.end(), r.id) == e.takers.end();
}

bool RelaxedReaders::on_its_way(const Reader& r, uint64_t s) const {
  auto it = in_ring_.find(s);
  if (it == in_ring_.end()) return false;
  for (uint64_t entry : it->second)
    if (may_take(r, ring_.at(entry))) return true;
  return false;
}

void RelaxedReaders::add_entry(uint64_t seq, std::vector<uint64_t> samples, uint32_t views,
                               bool published) {
  hold(next_entry_, samples, true);
  entry_[seq] = next_entry_;
  ring_[next_entry_++] = {seq, std::move(samples), views, published, {}};
}

void RelaxedReaders::filling(uint64_t seq, std::vector<uint64_t> samples, uint32_t views) {
  add_entry(seq, std::move(samples), views, false);
}

void RelaxedReaders::filled(uint64_t seq) {
  if (auto it = entry_.find(seq); it != entry_.end()) ring_.at(it->second).published = true;
}

void RelaxedReaders::retained(uint64_t seq, std::vector<uint64_t> samples, uint32_t views) {
  add_entry(seq, std::move(samples), views, true);
}

void RelaxedReaders::gone(uint64_t seq) {
  auto it = entry_.find(seq);
  if (it == entry_.end()) return;
  hold(it->second, ring_.at(it->second).samples, false);
  ring_.erase(it->second);
  entry_.erase(it);
}

std::vector<uint32_t> RelaxedReaders::rows_needed(const Reader& r, const Entry& e) const {
  std::vector<uint32_t> rows;
  if (!may_take(r, e)) return rows;
  for (uint32_t i = 0; i < e.samples.size(); ++i)
    if (e.samples[i] < dataset_size_ && needs(r, e.samples[i])) rows.push_back(i);
  return rows;
}

std::optional<RelaxedReaders::Offer> RelaxedReaders::offer(uint64_t reader) {
  auto rit = readers_.find(reader);
  if (rit == readers_.end() || rit->second.done) return std::nullopt;
  Reader& r = rit->second;
  bool advance = true;  // no chunk still filling before this one: the scan may move past it
  for (auto it = ring_.lower_bound(r.scan); it != ring_.end(); ++it) {
    const Entry& e = it->second;
    if (!e.published) {
      advance = false;
      continue;
    }
    auto rows = rows_needed(r, e);
    if (!rows.empty()) {
      Offer o{e.seq, std::move(rows), {}};
      for (uint32_t row : o.rows) o.samples.push_back(static_cast<uint32_t>(e.samples[row]));
      return o;
    }
    if (advance) r.scan = it->first + 1;  // needs only shrink within an epoch
  }
  return std::nullopt;
}

protocol::ChunkPosition RelaxedReaders::position(uint64_t reader, const Offer& offer) const {
  const Reader& r = readers_.at(reader);
  const auto n = static_cast<uint32_t>(offer.rows.size());
  protocol::ChunkPosition p;
  p.epoch = r.epoch;
  p.index_in_epoch = r.chunks;
  p.sample_start = r.had;
  p.sample_count = n;
  p.epoch_samples = r.epoch_samples;
  p.stream_position = r.total;
  p.epoch_end = r.needed == n;
  return p;
}

void RelaxedReaders::take(uint64_t reader, const Offer& offer) {
  Reader& r = readers_.at(reader);
  Entry& e = ring_.at(entry_.at(offer.seq));
  e.takers.push_back(reader);
  for (uint32_t row : offer.rows) {
    const uint64_t s = e.samples[row];
    r.need[s >> 6] &= ~(uint64_t{1} << (s & 63));
  }
  const uint64_t n = offer.rows.size();
  r.needed -= n;
  r.had += n;
  r.total += n;
  ++r.chunks;
  samples_taken_ += n;
  if (r.needed == 0) {
    ++r.epoch;
    start_epoch(r);
  }
}

bool RelaxedReaders::wanted(uint64_t seq) const {
  auto it = entry_.find(seq);
  if (it == entry_.end()) return false;
  const Entry& e = ring_.at(it->second);
  for (const auto& [id, r] : readers_)
    if (!r.done && !rows_needed(r, e).empty()) return true;
  return false;
}

bool RelaxedReaders::short_of(const Reader& r, uint64_t want) const {
  uint64_t n = 0;
  for (auto it = ring_.lower_bound(r.scan); it != ring_.end() && n < want; ++it)
    n += rows_needed(r, it->second).size();
  return n < want;
}

std::vector<uint64_t> RelaxedReaders::choose(
    uint32_t chunk_size, const std::function<uint32_t(uint64_t reader)>& credits, Hunger hunger) {
  std::vector<uint64_t> hungry;
  const uint32_t lead = hunger == Hunger::kAhead ? lead_chunks_ : 0;
  for (const auto& [id, r] : readers_)
    if (!r.done && short_of(r, uint64_t{credits(id) + lead} * chunk_size)) hungry.push_back(id);
  // The scarce one drives: the hungry reader that needs the fewest samples and has some not on
  // their way already.
  std::stable_sort(hungry.begin(), hungry.end(), [&](uint64_t a, uint64_t b) {
    return readers_.at(a).needed < readers_.at(b).needed;
  });
  for (uint64_t driver_id : hungry) {
    Reader& driver = readers_.at(driver_id);
    while (driver.cursor < driver.order.size() && !needs(driver, driver.order[driver.cursor]))
      ++driver.cursor;
    std::vector<std::pair<uint32_t, uint64_t>> candidates;  // (hungry others needing it, sample)
    const size_t want = size_t{chunk_size} * kCandidatesPerRow;
    for (size_t i = driver.cursor; i < driver.order.size() && candidates.size() < want; ++i) {
      const uint64_t s = driver.order[i];
      if (!needs(driver, s) || on_its_way(driver, s)) continue;
      uint32_t others = 0;
      for (uint64_t id : hungry)
        if (id != driver_id && needs(readers_.at(id), s)) ++others;
      candidates.emplace_back(others, s);
    }
    if (candidates.empty()) continue;
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<uint64_t> samples;
    for (size_t i = 0; i < candidates.size() && samples.size() < chunk_size; ++i)
      samples.push_back(candidates[i].second);
    return samples;
  }
  return {};
}

}  // namespace batchcast
