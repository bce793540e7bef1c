// TaskQueue (server/produce/task_queue.h): a private chunk's work goes before the stream's.
#include "server/produce/task_queue.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace batchcast {
namespace {

std::vector<int> drain(TaskQueue<int>& q) {
  q.close();
  std::vector<int> out;
  for (int t; q.pop(&t);) out.push_back(t);
  return out;
}

TEST(TaskQueue, APrivateChunksWorkGoesBeforeStreamWorkQueuedAheadOfIt) {
  TaskQueue<int> q;
  q.push(1, false);
  q.push(2, false);
  q.push(10, true);
  q.push(3, false);
  q.push(11, true);
  EXPECT_EQ(drain(q), (std::vector<int>{10, 11, 1, 2, 3})) << "each lane in its own order";
}

TEST(TaskQueue, CloseEndsEveryWaitingThreadOnceEmpty) {
  TaskQueue<int> q;
  std::vector<int> got;
  std::thread worker([&] {
    for (int t; q.pop(&t);) got.push_back(t);
  });
  q.push(7, false);
  q.push(8, true);
  q.close();
  worker.join();  // returns: pop() was false once the queue was closed and empty
  EXPECT_EQ(got.size(), 2u);
}

}  // namespace
}  // namespace batchcast
