#include "client/rebatcher.h"

#include <algorithm>

namespace batchcast {

namespace {

Rebatcher::Step step_of(Rebatcher::Step::Kind kind) {
  Rebatcher::Step s;
  s.kind = kind;
  return s;
}

}  // namespace

Rebatcher::Rebatcher(uint32_t batch_size, bool drop_last, uint64_t first_epoch,
                     uint64_t announced_epoch_samples)
    : batch_size_(batch_size),
      drop_last_(drop_last),
      epoch_(first_epoch),
      epoch_samples_(announced_epoch_samples),
      next_(first_epoch, 0) {}

std::optional<uint64_t> Rebatcher::batches_per_epoch() const {
  if (epoch_samples_ == 0) return std::nullopt;
  return drop_last_ ? epoch_samples_ / batch_size_
                    : (epoch_samples_ + batch_size_ - 1) / batch_size_;
}

Rebatcher::Step Rebatcher::step() {
  if (pending_epoch_end_) {
    pending_epoch_end_ = false;
    return epoch_end();
  }
  if (batch_.size == batch_size_) return take_batch();
  if (!current_ || pos_ == current_->sample_count) {
    bool ended_epoch = current_ && current_->epoch_end;
    current_.reset();
    if (ended_epoch) return close_epoch();
    if (stash_) {
      if (epoch_open_) return close_epoch();  // the stash starts the next epoch
      current_ = std::move(stash_);
      stash_.reset();
      pos_ = 0;
      epoch_open_ = true;
      epoch_ = current_->epoch;
    } else if (stream_ended_) {
      return close_epoch();
    } else {
      return step_of(Step::kNeedChunk);
    }
  }
  uint32_t k = std::min(batch_size_ - batch_.size, current_->sample_count - pos_);
  if (batch_.size == 0) batch_ = {current_->epoch, current_->sample_start + pos_, 0};
  Step s = step_of(Step::kPiece);
  s.start = pos_;
  s.count = k;
  pos_ += k;
  batch_.size += k;
  return s;
}

void Rebatcher::push(const protocol::ChunkPosition& c) {
  // Samples this consumer will never see: the part of the epoch before a late join, or chunks
  // reused before it was sent them (left behind under stall_policy=skip). Counted now, so the
  // epoch they cut short already reports them. Samples before a sought position were asked
  // away, not missed.
  if (sought_) {
    auto [epoch, sample] = *sought_;
    sought_.reset();
    expected_position_ = c.stream_position + c.sample_count;
    if (c.epoch_samples) epoch_samples_ = c.epoch_samples;
    epoch_open_ = true;
    epoch_ = c.epoch;
    current_ = c;
    pos_ = 0;
    if (c.epoch == epoch && sample > c.sample_start && sample < c.sample_start + c.sample_count)
      pos_ = static_cast<uint32_t>(sample - c.sample_start);
    next_ = {c.epoch, c.sample_start + pos_};
    return;
  }
  if (!expected_position_)
    skipped_ += c.sample_start;
  else if (c.stream_position > *expected_position_)
    skipped_ += c.stream_position - *expected_position_;
  expected_position_ = c.stream_position + c.sample_count;
  if (c.epoch_samples) epoch_samples_ = c.epoch_samples;  // learnt once a producer knows it
  if (epoch_open_ && c.epoch != epoch_) {  // a new epoch without its predecessor's end
    stash_ = c;
    return;
  }
  if (!epoch_open_) {
    epoch_open_ = true;
    epoch_ = c.epoch;
    next_ = {c.epoch, c.sample_start};
  }
  current_ = c;
  pos_ = 0;
}

void Rebatcher::end_of_stream() { stream_ended_ = true; }

void Rebatcher::seek(uint64_t epoch, uint64_t sample) {
  current_.reset();
  stash_.reset();
  pos_ = 0;
  batch_ = {};
  epoch_open_ = false;
  pending_epoch_end_ = false;
  epoch_ = epoch;
  next_ = {epoch, sample};
  sought_ = next_;
}

Rebatcher::Step Rebatcher::close_epoch() {
  epoch_open_ = false;
  if (batch_.size == 0 || (drop_last_ && batch_.size < batch_size_)) {
    batch_ = {};
    return epoch_end();
  }
  pending_epoch_end_ = true;
  return take_batch();
}

Rebatcher::Step Rebatcher::epoch_end() {
  next_ = {epoch_ + 1, 0};
  return step_of(Step::kEpochEnd);
}

Rebatcher::Step Rebatcher::take_batch() {
  Step s = step_of(Step::kBatch);
  s.batch = batch_;
  next_ = {batch_.epoch, batch_.sample_start + batch_.size};
  batch_ = {};
  return s;
}

}  // namespace batchcast
