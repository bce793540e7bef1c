// StreamHost against hostile and careless peers: malformed frames, messages before hello,
// forged releases and multi-frame messages are dropped and counted, and never disturb a real
// consumer. Also: endpoints are private (ipc 0600, tcp on loopback).
#include "server/host/stream_host.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

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
