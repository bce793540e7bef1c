// What StreamState logs (server/stream/stream_state.h, "Stalls are said", "Dropped messages are
// said"), against StreamState alone (stream_state_fixture.h): a warning for what a user should
// chase, none on a run that goes right. Its spdlog lines are captured from the default logger.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>
#include <string>

#include "tests/cpp/server/stream_state_fixture.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

// The default logger's lines at INFO and above, while it lives.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
    spdlog::set_level(spdlog::level::info);
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST(StreamState, WhatAConsumerSentBeforeTheEndAnsweringItsGoodbyeReachedItIsNoDroppedMessage) {
  CapturedLog log;
  Stream s(rules(4));
  s.join("a", 10);
  s.produce(2);
  s.tick();
  s.consume("a");
  s.send("a", protocol::Goodbye{});  // nothing held: it leaves at once, sent End
  ASSERT_EQ(s.take<protocol::End>("a").size(), 1u);
  ASSERT_EQ(s.state.stats().consumers_now, 0u);
  // Its session's heartbeat timer fired before End arrived: that heartbeat crossed End.
  s.send("a", protocol::Heartbeat{8, 0.0, {}});
  s.send("a", protocol::Credit{1});
  s.tick();
  EXPECT_EQ(s.state.stats().messages_dropped, 0u);
  EXPECT_EQ(log.text().find("dropped a message"), std::string::npos) << log.text();
  // A stranger's message still is one.
  s.send("stranger", protocol::Credit{1});
  EXPECT_EQ(s.state.stats().messages_dropped, 1u);
  EXPECT_NE(log.text().find("dropped a message from an unknown peer: message before hello"),
            std::string::npos)
      << log.text();
}

TEST(StreamState, TheStallClockStartsWithTheStreamNotWithTheWaitForMinConsumers) {
  CapturedLog log;
  StreamRules r = rules(3, /*min_consumers=*/2);
  r.stall_timeout_s = 2;
  Stream s(r);
  s.join("a", 10);
  EXPECT_EQ(s.produce_until_refused(), 3);  // the ring is full: the producer waits
  for (int i = 0; i < 10; ++i, s.now += 1) s.tick();  // five stall timeouts before the start
  s.join("b", 10);
  s.tick();
  EXPECT_EQ(log.text().find("has not moved"), std::string::npos) << log.text();
  // From the start on, a stream that does not move is said, naming who holds it.
  s.now += 3;
  s.tick();
  EXPECT_NE(log.text().find("the stream has not moved for"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("pid " + std::to_string(s.pid_of("b"))), std::string::npos)
      << log.text();
}

}  // namespace
}  // namespace batchcast
