// transport_bench: what the transport costs, between two real processes over real ZeroMQ and
// shared memory. Prints
//   1. publish-to-batch latency (p50/p99): the producer publishes one chunk at a time, stamped
//      with CLOCK_MONOTONIC; the consumer process reads the stamp when next() returns it and
//      drops the batch (its release lets the producer publish the next one: a round trip).
//   2. the highest batch rate one consumer sustains with tiny batches (1 sample of 8 bytes),
//      producer free-running on a ring of 16 slots.
// Usage: transport_bench [--latency-chunks N] [--rate-seconds S]
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "client/consumer.h"
#include "common/process.h"
#include "server/host/stream_host.h"

using namespace batchcast;

namespace {

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// Consumer process: reads until the stream ends; prints latencies (us) or the batch rate.
int consume(const std::string& ep, bool latency) {
  ConsumerOptions o;
  o.endpoint = ep;
  o.timeout_s = 20;
  o.prefetch = latency ? 1 : 8;
  Consumer c(o);
  std::vector<double> lat;
  uint64_t batches = 0;
  double start = 0;
  while (auto b = c.next()) {
    double now = monotonic_seconds();
    if (batches++ == 0) start = now;
    double stamp;
    std::memcpy(&stamp, b->tensors[0].data, sizeof(stamp));
    if (latency) lat.push_back((now - stamp) * 1e6);
  }
  double elapsed = monotonic_seconds() - start;
  if (latency) {
    std::printf("publish-to-batch latency over %zu chunks: p50 %.1f us, p99 %.1f us\n", lat.size(),
                percentile(lat, 0.5), percentile(lat, 0.99));
  } else {
    std::printf("tiny batches (1 sample, 8 bytes): %llu batches in %.2f s = %.0f batches/s\n",
                static_cast<unsigned long long>(batches), elapsed, batches / elapsed);
  }
  return 0;
}

void produce(StreamHost& core, uint64_t chunks, bool paced) {
  for (uint64_t c = 0; c < chunks; ++c) {
    auto lease = core.acquire();
    if (!lease) return;
    protocol::ChunkPosition position;
    std::vector<protocol::TensorSpec> tensors;
    position.index_in_epoch = c;
    position.sample_start = c;
    position.sample_count = 1;
    position.epoch_samples = chunks;
    position.epoch_end = c + 1 == chunks;
    tensors.push_back({"#", DType::kFloat64, {1}, {1}, 0});
    double stamp = monotonic_seconds();
    std::memcpy(lease->data, &stamp, sizeof(stamp));
    core.publish(*lease, position, std::move(tensors));
    if (paced) {  // wait until the consumer released it: one chunk in flight
      while (core.stats().ring_occupied > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  core.finish();
}

int run(bool latency, uint64_t chunks) {
  std::string ep = "ipc:///tmp/batchcast-bench-" + std::to_string(::getpid()) + ".sock";
  StreamHostOptions o;
  o.endpoint = ep;
  o.ring_slots = latency ? 2 : 16;
  o.slot_bytes = 4096;
  o.chunk_size = 1;
  o.epoch_samples = chunks;
  o.epochs = 1;
  StreamHost core(o);
  pid_t child = ::fork();
  if (child == 0) {
    int rc = consume(ep, latency);
    std::fflush(stdout);
    ::_exit(rc);
  }
  produce(core, chunks, latency);
  core.wait_finished(60);
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t latency_chunks = 5000, rate_chunks = 200000;
  CLI::App app{"batchcast transport benchmark"};
  app.add_option("--latency-chunks", latency_chunks)->capture_default_str();
  app.add_option("--rate-chunks", rate_chunks)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::printf("host: %u cores\n", std::thread::hardware_concurrency());
  std::fflush(stdout);
  int rc = run(true, latency_chunks);
  std::fflush(stdout);
  return rc ? rc : run(false, rate_chunks);
}
