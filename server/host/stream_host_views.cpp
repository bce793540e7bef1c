// StreamHost's views (stream_host.h, docs/views.md): the view a consumer's Hello asks for, the
// pool each new view gets (within the stream's ring budget, shrinking the ring to fit), and the
// memory of the slots the ring retired, given back once their chunks went. The rest of the I/O
// shell is in stream_host.cpp.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/error.h"
#include "server/host/stream_host.h"

namespace batchcast {

StreamState::ViewChoice StreamHost::choose_view_locked(const std::string& view) {
  StreamState::ViewChoice choice;
  try {
    StreamHostOptions::ViewAnswer answer = options_.find_view(view);
    choice.view = answer.view;
    choice.error = answer.error;
    // A view whose pool could not be made stays with the view provider (its index taken):
    // later new views would not line up with it, so none is added after one failed.
    if (choice.error.empty() && answer.view >= state_->view_count()) {
      if (!views_closed_.empty()) {
        choice.error = views_closed_;
      } else {
        try {
          add_view_locked(answer.slot_bytes, std::move(answer.specs));
        } catch (const std::exception& e) {
          views_closed_ = std::string("this server adds no views any more: ") + e.what();
          throw;
        }
      }
    }
  } catch (const std::exception& e) {
    choice.error = e.what();
  }
  return choice;
}

uint32_t StreamHost::serve_view(const std::string& view) {
  if (!options_.find_view) throw Error("this server serves one view, its own");
  std::lock_guard lk(mu_);
  StreamState::ViewChoice choice = choose_view_locked(view);
  if (!choice.error.empty()) throw Error(choice.error);
  return choice.view;
}

uint32_t StreamHost::add_view_locked(uint64_t slot_bytes, StreamState::ViewSpecs specs) {
  const uint32_t index = state_->view_count();
  const std::string name = memory_.pool().segment_name() + ".v" + std::to_string(index);
  // A slot index holds a stream chunk in every view: with a budget, the ring shrinks so that a
  // slot of every view fits it (the floor may put it over).
  uint64_t stream_bytes = memory_.pool().slot_bytes() + slot_bytes;
  for (const auto& view : view_memory_) stream_bytes += view->pool().slot_bytes();
  uint32_t slots = state_->usable_slots();
  if (options_.ring_budget)
    slots = std::min<uint64_t>(
        slots, std::max<uint64_t>(options_.min_ring_slots, options_.ring_budget / stream_bytes));
  const auto& gpus = options_.cuda_devices;
  try {
    // A GPU view's Welcome carries its own events, as many as view 0's: within kMaxCudaSlots,
    // checked when the pool was created.
    view_memory_.push_back(
        std::make_unique<SlotMemory>(SlotMemory::create(name, slots, slot_bytes, gpus)));
  } catch (const Error& e) {
    if (gpus.empty()) throw;
    throw Error("view " + std::to_string(index) + " needs a GPU pool of its own (" +
                std::to_string(slots) + " slots x " + std::to_string(slot_bytes >> 20) +
                " MiB on each of " + std::to_string(gpus.size()) +
                " GPU(s)) and it could not be made: " + e.what() +
                "; serve fewer views, a smaller --ring, or this view from another server");
  }
  state_->add_view(welcome(*view_memory_.back()), std::move(specs));
  const uint32_t ring = memory_.pool().slot_count();
  const bool shrinks = slots < state_->usable_slots();
  if (shrinks) state_->shrink_ring(slots);
  const std::string where =
      gpus.empty() ? "/dev/shm/" + name : "a GPU pool (header /dev/shm/" + name + ")";
  const double mib = 1048576.0;
  const uint64_t used = slots * stream_bytes;
  std::string budget;
  if (options_.ring_budget)
    budget = fmt::format("; the ring {} {} of its {} slots; the stream's pools: {:.1f} MiB of a "
                         "{:.1f} MiB budget{}",
                         shrinks ? "shrank to" : "keeps", slots, ring, used / mib,
                         options_.ring_budget / mib,
                         used > options_.ring_budget
                             ? " (over it: a ring keeps at least " +
                                   std::to_string(options_.min_ring_slots) + " slots)"
                             : "");
  else
    budget = fmt::format("; the stream's pools: {:.1f} MiB", used / mib);
  spdlog::info("view {}: {} slots x {:.1f} KiB ({:.1f} MiB) in {}{}", index, slots,
               slot_bytes / 1024.0, slots * (slot_bytes / mib), where, budget);
  return index;
}

void StreamHost::release_retired_slots(double now) {
  for (uint32_t slot : state_->take_retired_slots(now)) {
    for (uint32_t v = 0; v <= view_memory_.size(); ++v) {
      SlotPool& pool = view_pool(v);
      if (slot >= pool.slot_count()) continue;
      try {
        pool.release_slot_memory(slot);
      } catch (const Error& e) {
        spdlog::warn("{}", e.what());  // the memory stays taken; the stream goes on
      }
    }
  }
}

const SlotMemory& StreamHost::view_memory(uint32_t view) const {
  std::lock_guard lk(mu_);
  return view == 0 ? memory_ : *view_memory_.at(view - 1);
}

}  // namespace batchcast
