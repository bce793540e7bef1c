// StreamHost against hostile and careless peers: malformed frames, messages before hello,
// forged releases and multi-frame messages are dropped and counted, and never disturb a real
// consumer. Also: endpoints are private (ipc 0600, tcp on loopback), and a private chunk is
// written only in its consumer's view.
#include "server/host/stream_host.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <optional>
#include <thread>
#include <zmq.hpp>

#include "client/consumer.h"
#include "common/error.h"

namespace batchcast {
namespace {

std::string test_endpoint(const char* tag) {
  return "ipc:///tmp/bctest-core-" + std::to_string(::getpid()) + "-" + tag + ".sock";
}

StreamHostOptions small_server(const std::string& ep) {
  StreamHostOptions o;
  o.endpoint = ep;
  o.ring_slots = 4;
  o.slot_bytes = 4096;
  o.chunk_size = 4;
  o.epoch_samples = 8;
  o.epochs = 1;
  return o;
}

// Publishes `chunks` chunks of 4 int64 samples whose values are their epoch positions.
void produce(StreamHost& core, int chunks) {
  for (int c = 0; c < chunks; ++c) {
    auto lease = core.acquire();
    ASSERT_TRUE(lease);
    auto* v = reinterpret_cast<int64_t*>(lease->data);
    for (int i = 0; i < 4; ++i) v[i] = c * 4 + i;
    protocol::ChunkPosition position;
    position.index_in_epoch = c;
    position.sample_start = c * 4;
    position.sample_count = 4;
    position.epoch_samples = chunks * 4;
    position.epoch_end = c + 1 == chunks;
    core.publish(*lease, position, {{"#", DType::kInt64, {4}, {1}, 0}});
  }
  core.finish();
}

void send_raw(zmq::socket_t& s, const std::string& bytes) {
  s.send(zmq::buffer(bytes), zmq::send_flags::none);
}

uint64_t wait_dropped(StreamHost& core, uint64_t at_least) {
  for (int i = 0; i < 200 && core.stats().messages_dropped < at_least; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return core.stats().messages_dropped;
}

TEST(StreamHost, HostileMessagesAreDroppedAndCountedAndNobodyIsDisturbed) {
  auto ep = test_endpoint("hostile");
  StreamHost core(small_server(ep));
  zmq::context_t ctx;
  zmq::socket_t evil(ctx, zmq::socket_type::dealer);
  evil.connect(ep);
  send_raw(evil, "");                                                  // empty frame
  send_raw(evil, std::string(64, '\xff'));                             // garbage
  send_raw(evil, protocol::encode(protocol::Release{0, 0}));           // before hello
  send_raw(evil, protocol::encode(protocol::Credit{5}).substr(0, 9));  // truncated
  evil.send(zmq::buffer(std::string("a")), zmq::send_flags::sndmore);  // two frames
  evil.send(zmq::buffer(std::string("b")), zmq::send_flags::none);
  EXPECT_GE(wait_dropped(core, 5), 5u);

  ConsumerOptions co;
  co.endpoint = ep;
  co.timeout_s = 10;
  Consumer consumer(co);
  std::thread producer([&] { produce(core, 2); });
  auto first = consumer.next();
  ASSERT_TRUE(first);

  // The hostile peer says hello, then tries to free the slot the consumer is reading.
  protocol::Hello hello;
  hello.pid = static_cast<uint32_t>(::getpid());
  send_raw(evil, protocol::encode(hello));
  zmq::message_t welcome;
  ASSERT_TRUE(evil.recv(welcome));
  uint64_t before = core.stats().messages_dropped;
  for (uint32_t slot = 0; slot < 4; ++slot)
    for (uint64_t seq = 0; seq < 2; ++seq)
      send_raw(evil, protocol::encode(protocol::Release{seq, slot}));
  send_raw(evil, protocol::encode(protocol::Goodbye{}));
  EXPECT_GE(wait_dropped(core, before + 8), before + 8) << "forged releases must be refused";

  const auto* values = static_cast<const int64_t*>(first->tensors[0].data);
  EXPECT_EQ(values[0], 0);
  EXPECT_EQ(values[3], 3);
  auto second = consumer.next();
  ASSERT_TRUE(second);
  EXPECT_EQ(static_cast<const int64_t*>(second->tensors[0].data)[0], 4);
  EXPECT_FALSE(consumer.next()) << "epoch end";
  producer.join();
  EXPECT_TRUE(core.wait_finished(10));
}

// core.waited_chunk() once it equals `want`, or its last value after 10 s.
std::optional<uint64_t> wait_waited(const StreamHost& core, std::optional<uint64_t> want) {
  for (int i = 0; i < 1000 && core.waited_chunk() != want; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return core.waited_chunk();
}

TEST(StreamHost, TheProducerLearnsWhichChunkAConsumerWaitsFor) {
  // The event loop hands StreamState::waited_chunk to the producer (--decoder mixed's split):
  // a consumer that has read everything it was sent waits for the stream's head.
  auto ep = test_endpoint("waited");
  StreamHost core(small_server(ep));
  EXPECT_EQ(core.waited_chunk(), std::nullopt) << "nobody attached";
  ConsumerOptions co;
  co.endpoint = ep;
  co.timeout_s = 10;
  Consumer consumer(co);
  EXPECT_EQ(wait_waited(core, 0), std::optional<uint64_t>(0));
  auto lease = core.acquire();
  ASSERT_TRUE(lease);
  protocol::ChunkPosition position;
  position.sample_count = 4;
  position.epoch_samples = 8;
  core.publish(*lease, position, {{"#", DType::kInt64, {4}, {1}, 0}});
  ASSERT_TRUE(consumer.next());  // chunk 0 read: chunk 1 is what it waits for now
  EXPECT_EQ(wait_waited(core, 1), std::optional<uint64_t>(1));
}

// Publishes chunk `index` of epoch 0 into every view `lease` fills.
void publish_index(StreamHost& core, const FillLease& lease, uint64_t index) {
  for (uint8_t* slot : lease.views)
    if (slot) reinterpret_cast<int64_t*>(slot)[0] = static_cast<int64_t>(index);
  protocol::ChunkPosition position;
  position.index_in_epoch = index;
  position.sample_start = index * 4;
  position.sample_count = 4;
  position.epoch_samples = 32;
  core.publish(lease, position, {{"#", DType::kInt64, {4}, {1}, 0}});
}

TEST(StreamHost, APrivateChunkIsWrittenInItsConsumersViewOnly) {
  auto ep = test_endpoint("views");
  StreamHostOptions o = small_server(ep);
  o.ring_slots = 8;
  o.epoch_samples = 32;
  o.regenerates = true;
  o.find_view = [](const std::string& view) {  // "1", "2": views of int64 chunks like view 0's
    StreamHostOptions::ViewAnswer a;
    a.view = view.empty() ? 0 : static_cast<uint32_t>(std::stoul(view));
    a.slot_bytes = 4096;
    a.specs = [](uint32_t n) {
      return std::vector<protocol::TensorSpec>{{"#", DType::kInt64, {int64_t{n}}, {1}, 0}};
    };
    return a;
  };
  StreamHost core(o);
  for (uint64_t c = 0; c < 2; ++c) {  // before the views: in view 0 alone
    auto lease = core.acquire();
    ASSERT_TRUE(lease);
    EXPECT_EQ(lease->views.size(), 1u);
    publish_index(core, *lease, c);
  }
  ASSERT_EQ(core.serve_view("1"), 1u);
  ASSERT_EQ(core.serve_view("2"), 2u);
  auto stream = core.acquire();
  ASSERT_TRUE(stream);
  ASSERT_EQ(stream->views.size(), 3u);
  for (uint8_t* slot : stream->views) EXPECT_TRUE(slot) << "a stream chunk is in every view";
  publish_index(core, *stream, 2);

  // A consumer of view 1 joins: chunks 0 and 1 are not in its view, so they are made for it.
  zmq::context_t ctx;
  zmq::socket_t peer(ctx, zmq::socket_type::dealer);
  peer.connect(ep);
  protocol::Hello hello;
  hello.pid = static_cast<uint32_t>(::getpid());
  hello.view = "1";
  send_raw(peer, protocol::encode(hello));
  send_raw(peer, protocol::encode(protocol::Credit{8}));
  auto mine = core.acquire_private(10);
  ASSERT_TRUE(mine);
  ASSERT_EQ(mine->views.size(), 3u);
  EXPECT_FALSE(mine->views[0]) << "view 0's slot is not written";
  EXPECT_EQ(mine->views[1], core.view_memory(1).slot_data(mine->slot));
  EXPECT_FALSE(mine->views[2]) << "view 2's slot is not written";
  publish_index(core, *mine, mine->regenerate->index);
  EXPECT_EQ(core.view_memory(1).pool().slot_seq(mine->slot), mine->seq) << "its consumer reads it";
  for (uint32_t v : {0u, 2u})
    EXPECT_EQ(core.view_memory(v).pool().slot_seq(mine->slot), SlotPool::kNoChunk)
        << "no consumer of view " << v << " may take the slot for a chunk";
  core.stop();
}

TEST(StreamHost, IpcSocketIsOwnerOnlyAndTcpBindsLoopback) {
  auto ep = test_endpoint("mode");
  {
    StreamHost core(small_server(ep));
    struct stat st {};
    ASSERT_EQ(::stat(ep.substr(6).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  EXPECT_NE(::access(ep.substr(6).c_str(), F_OK), 0) << "socket file removed on exit";
  auto o = small_server("tcp://*:*");
  StreamHost tcp(o);
  EXPECT_EQ(tcp.endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << tcp.endpoint();
}

TEST(StreamHost, ConsumerWithoutServerFailsWithAClearMessage) {
  ConsumerOptions co;
  co.endpoint = test_endpoint("nobody");
  co.timeout_s = 0.5;
  try {
    Consumer c(co);
    FAIL() << "connected to nothing";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("batchcast serve --endpoint"), std::string::npos);
  }
}

TEST(StreamHost, BadEndpointsAreRefusedWithTheFix) {
  EXPECT_THROW(StreamHost(small_server("http://x")), Error);
  EXPECT_THROW(StreamHost(small_server("tcp://127.0.0.1")), Error);
}

}  // namespace
}  // namespace batchcast
