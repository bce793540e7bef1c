// StreamState's views (stream_state.h, docs/views.md): the views it knows, and each consumer's
// chunks sent with its view's tensors. Which chunks a view's consumer may be sent is decided
// where the cursors move (stream_state.cpp, stream_seek.cpp) through view_since().
#include "server/stream/stream_state.h"

namespace batchcast {

using protocol::ChunkDescriptor;

uint32_t StreamState::add_view(protocol::Welcome welcome, ViewSpecs specs) {
  views_.push_back({std::move(welcome), std::move(specs), next_acquire_seq_});
  return static_cast<uint32_t>(views_.size());
}

bool StreamState::send_chunk(const ConsumerRecord& c, const ChunkDescriptor& d) {
  bool sent;
  if (c.view == 0) {
    sent = send_(c.identity, d);
  } else {
    ChunkDescriptor mine = d;
    mine.tensors = views_[c.view - 1].specs(d.position.sample_count);
    sent = send_(c.identity, mine);
  }
  if (sent) counters_.samples_sent += d.position.sample_count;
  return sent;
}

}  // namespace batchcast
