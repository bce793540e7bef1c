#include "server/stream/consumer_registry.h"

namespace batchcast {

ConsumerRecord& ConsumerRegistry::add(ConsumerRecord record) {
  record.id = next_id_++;
  by_identity_[record.identity] = record.id;
  return by_id_.emplace(record.id, std::move(record)).first->second;
}

ConsumerRecord* ConsumerRegistry::find_by_identity(const std::string& identity) {
  auto it = by_identity_.find(identity);
  if (it == by_identity_.end()) return nullptr;
  return &by_id_.at(it->second);
}

size_t ConsumerRegistry::reading() const {
  size_t n = 0;
  for (const auto& [id, c] : by_id_) n += c.closing ? 0 : 1;
  return n;
}

void ConsumerRegistry::erase(uint64_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  by_identity_.erase(it->second.identity);
  by_id_.erase(it);
}

}  // namespace batchcast
