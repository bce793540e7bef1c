// Endpoint naming: rank endpoints and failure records.
#include "protocol/endpoint.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace batchcast::protocol {
namespace {

// serve --every-rank: rank r's stream listens beside the endpoint given.
TEST(Endpoint, EveryRankHasItsOwnEndpoint) {
  EXPECT_EQ(rank_endpoint("ipc:///tmp/bc.sock", 3), "ipc:///tmp/bc.sock.rank3");
  EXPECT_EQ(rank_endpoint("tcp://127.0.0.1:5550", 2), "tcp://127.0.0.1:5552");
  EXPECT_EQ(rank_endpoint("tcp://*:7000", 0), "tcp://*:7000");
  EXPECT_THROW(rank_endpoint("tcp://127.0.0.1:65535", 1), batchcast::Error);
  EXPECT_THROW(rank_endpoint("inproc://x", 0), batchcast::Error);
  EXPECT_THROW(rank_endpoint("tcp://host", 1), batchcast::Error);
}

TEST(Endpoint, FailureRecordSitsBesideAnIpcSocketOnly) {
  EXPECT_EQ(failure_record_path("ipc:///tmp/bc.sock"), "/tmp/bc.sock.failed");
  EXPECT_EQ(failure_record_path("ipc://@abstract"), "");
  EXPECT_EQ(failure_record_path("tcp://127.0.0.1:5550"), "");
  EXPECT_EQ(default_endpoint().rfind("ipc:///tmp/batchcast-", 0), 0u);
}

}  // namespace
}  // namespace batchcast::protocol
