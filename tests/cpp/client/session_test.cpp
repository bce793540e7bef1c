// A consumer's session when the server's messages cross its own: the test plays the server on
// a real ROUTER socket over a real pool, because a real server cannot be made to send a chunk
// exactly while a consumer closes (a race of microseconds, which is how it bit: a trainer that
// closed one loader and opened another kept two slots held for good, test_resume's stall), and
// because no server sends a relaxed consumer the rows it takes of a chunk yet.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <zmq.hpp>

#include "client/consumer.h"
#include "common/process.h"
#include "shm/slot_memory.h"

namespace batchcast {
namespace {

// The server's side of the protocol, one message at a time, for one consumer.
class ScriptedServer {
 public:
  explicit ScriptedServer(const std::string& tag)
      : endpoint_("ipc:///tmp/bctest-session-" + std::to_string(::getpid()) + "-" + tag + ".sock"),
        memory_(SlotMemory::create(segment_name_for(endpoint_), 4, 4096, {})) {
    router_.set(zmq::sockopt::linger, 0);
    router_.bind(endpoint_);
  }
  ~ScriptedServer() {
    router_.close();
    ::unlink(endpoint_.substr(std::string("ipc://").size()).c_str());
  }
  const std::string& endpoint() const { return endpoint_; }

  // The consumer's next message; nullopt after `timeout_s` (the test fails on it).
  std::optional<protocol::Message> receive(double timeout_s) {
    zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(static_cast<int>(timeout_s * 1000)));
    if (!(item.revents & ZMQ_POLLIN)) return std::nullopt;
    zmq::message_t identity, body;
    (void)router_.recv(identity);
    (void)router_.recv(body);
    identity_ = identity.to_string();
    auto m = protocol::decode(body.data(), body.size()).message;
    if (m && std::holds_alternative<protocol::Hello>(*m)) hello_ = std::get<protocol::Hello>(*m);
    return m;
  }
  const protocol::Hello& hello() const { return hello_; }
  // Skips messages until one of type T; false if none came within `timeout_s` of each other.
  template <typename T>
  bool receive_until(double timeout_s) {
    while (auto m = receive(timeout_s))
      if (std::holds_alternative<T>(*m)) return true;
    return false;
  }
  void send(const protocol::Message& m) {
    router_.send(zmq::buffer(identity_), zmq::send_flags::sndmore);
    router_.send(zmq::buffer(protocol::encode(m)), zmq::send_flags::none);
  }
  // Answers the Hello: a host pool of 4 slots, chunks of 4 int64 samples, epochs of 2 chunks,
  // served in `order`.
  void welcome(double heartbeat_timeout_s, protocol::Order order = protocol::Order::kExact) {
    ASSERT_TRUE(receive_until<protocol::Hello>(10));
    protocol::Welcome w;
    w.consumer_id = 1;
    w.server_pid = static_cast<uint32_t>(::getpid());
    w.boot_id = host_boot_id();
    w.chunk_size = 4;
    w.epoch_samples = 8;
    w.epochs = 1;
    w.heartbeat_timeout_s = heartbeat_timeout_s;
    w.order = order;
    memory_.describe(w);
    send(w);
  }
  // Publishes chunk `seq` in slot `slot` and sends its descriptor.
  void chunk(uint64_t seq, uint32_t slot) {
    memory_.pool().set_slot_seq(slot, seq);
    protocol::ChunkDescriptor d;
    d.seq = seq;
    d.slot = slot;
    d.position.index_in_epoch = seq;
    d.position.sample_start = seq * 4;
    d.position.sample_count = 4;
    d.position.epoch_samples = 8;
    d.position.epoch_end = seq == 1;
    d.tensors = {{"#", DType::kInt64, {4}, {1}, 0}};
    send(d);
  }
  // Publishes chunk `seq` of 8 labels (100 + row) in `slot` and sends a relaxed consumer's
  // descriptor of it: the rows `take` (dataset index 1000 + row), the first samples of its epoch 0.
  void taken_rows(uint64_t seq, uint32_t slot, std::vector<uint32_t> take) {
    for (int64_t row = 0; row < 8; ++row)
      reinterpret_cast<int64_t*>(memory_.slot_data(slot))[row] = 100 + row;
    memory_.pool().set_slot_seq(slot, seq);
    protocol::ChunkDescriptor d;
    d.seq = seq;
    d.slot = slot;
    d.position.sample_count = static_cast<uint32_t>(take.size());
    d.position.epoch_samples = 8;
    d.tensors = {{"#", DType::kInt64, {8}, {1}, 0}};
    for (uint32_t row : take) d.samples.push_back(1000 + row);
    d.take = std::move(take);
    send(d);
  }

 private:
  std::string endpoint_;
  SlotMemory memory_;
  zmq::context_t context_{1};
  zmq::socket_t router_{context_, zmq::socket_type::router};
  std::string identity_;
  protocol::Hello hello_;
};

// A consumer that connects and closes at once, holding nothing, on a thread of its own: the
// future is ready once close() returned. Detached, so that a close() that never returns fails
// the test instead of hanging it.
std::future<void> connect_and_close(const std::string& endpoint) {
  std::packaged_task<void()> task([endpoint] {
    ConsumerOptions o;
    o.endpoint = endpoint;
    o.timeout_s = 10;
    Consumer consumer(o);
    consumer.close();  // nothing views the pool: the session ends here
  });
  auto closed = task.get_future();
  std::thread(std::move(task)).detach();
  return closed;
}

TEST(Session, ChunksOnTheirWayWhenAConsumerClosesAreReleasedUntilTheServersEnd) {
  ScriptedServer server("in-flight");
  auto closed = connect_and_close(server.endpoint());
  server.welcome(/*heartbeat_timeout_s=*/30);
  // The server sent two chunks before it read the Goodbye, then End in answer to it.
  ASSERT_TRUE(server.receive_until<protocol::Goodbye>(10));
  server.chunk(0, 0);
  server.chunk(1, 1);
  server.send(protocol::End{1});
  std::set<std::pair<uint64_t, uint32_t>> released;
  while (released.size() < 2) {
    auto m = server.receive(10);
    if (!m) break;
    if (auto* r = std::get_if<protocol::Release>(&*m)) released.insert({r->seq, r->slot});
  }
  EXPECT_EQ(released, (std::set<std::pair<uint64_t, uint32_t>>{{0, 0}, {1, 1}}))
      << "a chunk the consumer never let go of stays held until its process exits";
  ASSERT_EQ(closed.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  closed.get();
}

TEST(Session, AClosingConsumerWaitsForTheServersEndNoLongerThanItsHeartbeatTimeout) {
  ScriptedServer server("no-end");
  auto closed = connect_and_close(server.endpoint());
  server.welcome(/*heartbeat_timeout_s=*/0.5);
  ASSERT_TRUE(server.receive_until<protocol::Goodbye>(10));
  // No End: the server is stuck. The consumer goes after 0.5 s; 10 s is only a safety net.
  ASSERT_EQ(closed.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "close() waited for a server that never answered";
  closed.get();
}

// A relaxed consumer says so in its Hello; the rows it takes of a chunk are copied out on arrival
// and the slot released before anyone reads them, and its batch is those rows, in take's order,
// with their dataset indices.
TEST(Session, RowsTakenOfAChunkAreCopiedOutAndTheSlotReleasedOnArrival) {
  ScriptedServer server("take");
  std::promise<void> read;
  std::packaged_task<std::vector<int64_t>()> task([&server, go = read.get_future()]() mutable {
    ConsumerOptions o;
    o.endpoint = server.endpoint();
    o.timeout_s = 10;
    o.batch_size = 3;
    o.order = protocol::Order::kRelaxed;
    Consumer consumer(o);
    go.wait();
    auto batch = consumer.next();
    if (consumer.order() != protocol::Order::kRelaxed || !batch || !batch->copied ||
        batch->tensors[0].shape[0] != 3 ||
        batch->samples != std::vector<uint32_t>{1001, 1004, 1006})
      return std::vector<int64_t>{};
    const auto* labels = static_cast<const int64_t*>(batch->tensors[0].data);
    return std::vector<int64_t>(labels, labels + 3);
  });
  auto labels = task.get_future();
  std::thread(std::move(task)).detach();
  server.welcome(/*heartbeat_timeout_s=*/30, protocol::Order::kRelaxed);
  EXPECT_EQ(server.hello().order, protocol::Order::kRelaxed);
  const uint64_t seq = protocol::kRelaxedSeqBase + 9;
  server.taken_rows(seq, 2, {1, 4, 6});
  std::optional<protocol::Release> released;
  while (!released) {
    auto m = server.receive(10);
    if (!m) break;
    if (auto* r = std::get_if<protocol::Release>(&*m)) released = *r;
  }
  ASSERT_TRUE(released) << "the slot of rows taken stays held until they are read";
  EXPECT_EQ(released->seq, seq);
  EXPECT_EQ(released->slot, 2u);
  read.set_value();
  ASSERT_TRUE(server.receive_until<protocol::Goodbye>(10));
  server.send(protocol::End{1});  // the answer the leaving consumer waits for
  ASSERT_EQ(labels.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(labels.get(), (std::vector<int64_t>{101, 104, 106}));
}

// A relaxed consumer resumed inside an epoch sends the samples it had there, in frames, and then
// its Seek: the server reads them in that order.
TEST(Session, AResumeSendsTheSamplesHadBeforeItsSeek) {
  ScriptedServer server("had");
  std::promise<void> asked;
  std::thread([&server, done = asked.get_future()]() mutable {
    ConsumerOptions o;
    o.endpoint = server.endpoint();
    o.timeout_s = 10;
    o.order = protocol::Order::kRelaxed;
    Consumer consumer(o);
    std::vector<uint64_t> had(2 * protocol::kMaxHadWords, 0);
    had[3] = 0b101;
    had.back() = uint64_t{1} << 63;
    consumer.seek(1, 3, had);
    try {
      consumer.next();  // sends the seek; the test's End ends the wait
    } catch (const std::exception&) {
    }
    done.wait();
  }).detach();
  server.welcome(/*heartbeat_timeout_s=*/30, protocol::Order::kRelaxed);
  std::vector<protocol::HadSamples> parts;
  std::optional<protocol::Seek> seek;
  while (!seek) {
    auto m = server.receive(10);
    if (!m) break;
    if (auto* part = std::get_if<protocol::HadSamples>(&*m)) parts.push_back(*part);
    if (auto* s = std::get_if<protocol::Seek>(&*m)) seek = *s;
  }
  ASSERT_TRUE(seek) << "no Seek came";
  EXPECT_EQ(seek->epoch, 1u);
  EXPECT_EQ(seek->sample, 3u);
  ASSERT_EQ(parts.size(), 2u) << "not one frame per run of words";
  EXPECT_EQ(parts[0].epoch, 1u);
  EXPECT_EQ(parts[0].first_word, 3u);
  EXPECT_EQ(parts[0].words, std::vector<uint64_t>{0b101});
  EXPECT_EQ(parts[1].first_word, 2 * protocol::kMaxHadWords - 1);
  EXPECT_EQ(parts[1].words, std::vector<uint64_t>{uint64_t{1} << 63});
  server.send(protocol::SeekReply{1, 3, true, ""});
  server.send(protocol::End{1});
  asked.set_value();
  ASSERT_TRUE(server.receive_until<protocol::Goodbye>(10));
  server.send(protocol::End{1});
}

}  // namespace
}  // namespace batchcast
