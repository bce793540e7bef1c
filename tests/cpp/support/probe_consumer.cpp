// probe_consumer: a real consumer process for the transport tests. It reads batches from a
// server of synthetic samples, checks every byte against the sample index in its label tensor,
// and writes one line per batch to stdout:
//   W                    (welcomed: the server answered the handshake)
//   B <epoch> <sample_start> <size> <copied> <idx,idx,...> <fnv hash of the batch bytes>
//   E <epoch>            (epoch end)
//   S <batches> <samples> <skipped> <copies>   (at the end)
// Exit code 0 on success, 3 on a byte mismatch, 4 on an error (message on stderr).
// Hardening options (tests/cpp/hardening): --verify-delay-ms holds each batch that long before
// checking its bytes (so a slot reused while held is caught), --leave-after leaves mid-stream
// (Goodbye, exit 0), --no-verify serves image datasets (the label tensor holds class ids),
// --stop-after stops the process (SIGSTOP, until SIGCONT) holding its last batch: a consumer
// frozen at a known point of the stream, whatever the machine's load.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <thread>

#include "client/consumer.h"
#include "common/error.h"
#include "server/produce/synthetic_source.h"

int main(int argc, char** argv) {
  using namespace batchcast;
  ConsumerOptions o;
  uint64_t epochs = 0, max_batches = 0;
  int sleep_ms = 0, verify_delay_ms = 0;
  uint64_t leave_after = 0, stop_after = 0;
  bool hold_all = false, next_epoch = false, no_verify = false;
  CLI::App app{"probe consumer"};
  app.add_option("--endpoint", o.endpoint)->required();
  app.add_option("--batch-size", o.batch_size);
  app.add_option("--epochs", epochs, "stop after this many epoch ends (0: until the stream ends)");
  app.add_option("--max-batches", max_batches, "then pause forever (to be killed)");
  app.add_option("--sleep-ms", sleep_ms, "per batch");
  app.add_option("--timeout", o.timeout_s);
  app.add_option("--max-held", o.max_held);
  app.add_flag("--drop-last", o.drop_last);
  app.add_flag("--hold-all", hold_all, "keep every batch alive until the end");
  app.add_flag("--next-epoch", next_epoch, "late_join=next_epoch");
  app.add_option("--verify-delay-ms", verify_delay_ms, "hold each batch this long, then check it");
  app.add_option("--leave-after", leave_after, "leave (Goodbye, exit 0) after this many batches");
  app.add_option("--stop-after", stop_after, "SIGSTOP itself after this many batches");
  app.add_flag("--no-verify", no_verify,
               "do not check bytes (image data); print labels as indices");
  CLI11_PARSE(app, argc, argv);
  if (next_epoch) o.late_join = protocol::LateJoin::kNextEpoch;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    Consumer consumer(o);
    std::printf("W\n");
    std::vector<std::shared_ptr<Batch>> held;
    uint64_t epochs_done = 0, batches = 0;
    bool in_epoch = false;
    while (!consumer.finished() && (epochs == 0 || epochs_done < epochs)) {
      auto b = consumer.next();
      if (!b) {
        if (in_epoch) std::printf("E %llu\n", static_cast<unsigned long long>(consumer.epoch()));
        in_epoch = false;
        ++epochs_done;
        continue;
      }
      in_epoch = true;
      const auto& data = b->tensors.at(0);
      const auto& label = b->tensors.at(1);
      uint64_t row = data.shape.size() > 1 ? data.shape[1] : 0;
      if (no_verify) row = 0;
      if (verify_delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(verify_delay_ms));
      uint64_t hash = 1469598103934665603ull;
      std::string idx;
      for (uint32_t i = 0; i < b->size; ++i) {
        auto index = static_cast<const int64_t*>(label.data)[i * label.strides[0]];
        const auto* bytes = static_cast<const uint8_t*>(data.data) + i * data.strides[0];
        for (uint64_t j = 0; j < row; ++j) {
          if (bytes[j] != synthetic_byte(index, j)) {
            std::fprintf(stderr, "byte %llu of sample %lld is wrong\n",
                         static_cast<unsigned long long>(j), static_cast<long long>(index));
            return 3;
          }
          hash = (hash ^ bytes[j]) * 1099511628211ull;
        }
        idx += (i ? "," : "") + std::to_string(index);
      }
      std::printf("B %llu %llu %u %d %s %016llx\n", static_cast<unsigned long long>(b->epoch),
                  static_cast<unsigned long long>(b->sample_start), b->size, b->copied ? 1 : 0,
                  idx.c_str(), static_cast<unsigned long long>(hash));
      if (hold_all) held.push_back(b);
      if (sleep_ms) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      ++batches;
      if (stop_after && batches == stop_after) ::raise(SIGSTOP);  // `b` stays held meanwhile
      if (leave_after && batches >= leave_after) break;
      if (max_batches && batches >= max_batches) {
        std::printf("P paused\n");
        while (true) ::pause();
      }
    }
    auto s = consumer.stats();
    std::printf("S %llu %llu %llu %llu\n", static_cast<unsigned long long>(s.batches),
                static_cast<unsigned long long>(s.samples),
                static_cast<unsigned long long>(s.skipped),
                static_cast<unsigned long long>(s.copies));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "probe_consumer: %s\n", e.what());
    return 4;
  }
}
