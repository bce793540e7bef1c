// The options of `batchcast serve`, each declared once: its name (the ServeConfig field, the
// Python keyword, and with - for _ the command-line flag), its group in --help, its help, the rule
// its value keeps and the check its text gets. The transform's options are the view fields
// (decoders/view.h, for_each_view_field) as view_field_option() turns them into serve options.
//
// Everything that spells an option walks these lists: the command line (serve_cli.cpp: CLI11
// options and serve_command_line(), the way back), the Python binding of ServeConfig
// (python/src/bind_serve.cpp: its fields, and ServeConfig.options(), from which the .pyi stub and
// docs/options.md are checked). A new option is one line in for_each_serve_setting() (and its
// field in ServeConfig).
//
// Contract: constant tables and pure functions; thread-safe.
#pragma once

#include <map>
#include <string>

#include "decoders/view.h"
#include "server/serve/serve_config.h"

namespace batchcast {

struct ServeOption {
  // What the option's text is checked against beyond its type and rule.
  enum class Check { kNone, kExistingDirectory, kExistingFile, kDevice, kViewText, kByteSize };
  const char* name;   // ServeConfig field / Python keyword
  const char* group;  // in --help
  const char* help;
  ValueRule rule = view_rules::kAny;  // of each number
  Check check = Check::kNone;
  const char* env = nullptr;  // the environment variable that gives it, if any
  // The flag when it is not --NAME with - for _ (a list's flag is singular, repeated).
  const char* flag = nullptr;
  // A bool spelled as a flag that sets it false (--eval for train).
  bool inverted = false;

  std::string flag_text() const;  // "--batch-size"
};

// Calls visit(option, member, names) for every ServeConfig field but the transform, in --help's
// order: `member` a pointer to the ServeConfig member, `names` its values' names (a
// const std::map<std::string, T>*; null but for enums).
template <typename Visit>
void for_each_serve_setting(Visit&& visit) {
  using C = ServeConfig;
  using Check = ServeOption::Check;
  namespace r = view_rules;
  const std::map<std::string, std::string>* text = nullptr;
  const std::map<std::string, bool>* flag = nullptr;
  const std::map<std::string, uint32_t>* u32 = nullptr;
  const std::map<std::string, uint64_t>* u64 = nullptr;
  const std::map<std::string, double>* real = nullptr;
  const std::map<std::string, std::vector<std::string>>* texts = nullptr;
  visit(ServeOption{"data", "Data", "image folder (torchvision ImageFolder layout)", r::kAny,
                    Check::kExistingDirectory},
        &C::data, text);
  visit(ServeOption{"file_list", "Data", "text file of 'path label' lines", r::kAny,
                    Check::kExistingFile},
        &C::file_list, text);
  visit(ServeOption{"synthetic", "Data", "serve N synthetic samples (tests, benchmarks)",
                    r::kPositive},
        &C::synthetic, u64);
  visit(ServeOption{"sample_bytes", "Data", "bytes per synthetic sample", r::kPositive},
        &C::sample_bytes, u64);
  visit(ServeOption{"on_error", "Data", "bad samples: raise (fail the stream) or skip (count them)"},
        &C::on_error, &ServeConfig::kOnError);
  visit(ServeOption{"endpoint", "Stream",
                    "ipc://PATH or tcp://HOST:PORT (default ipc:///tmp/batchcast-UID.sock)"},
        &C::endpoint, text);
  visit(ServeOption{"listen_all", "Stream",
                    "let tcp://*:PORT listen on every interface, not only loopback"},
        &C::listen_all, flag);
  visit(ServeOption{"batch_size", "Stream", "samples per chunk; consumers' default batch size",
                    r::kPositive},
        &C::batch_size, u32);
  visit(ServeOption{"epochs", "Stream", "epochs to serve (0: until stopped)"}, &C::epochs, u64);
  visit(ServeOption{"shuffle", "Stream", "shuffle every epoch (--no-shuffle: in order)"},
        &C::shuffle, flag);
  visit(ServeOption{"min_consumers", "Stream", "consumers to wait for before the stream starts"},
        &C::min_consumers, u32);
  visit(ServeOption{"ring", "Stream",
                    "slots in the shared pool (0: as many as --ring-memory holds, 8 on a GPU; the "
                    "window in which trainers of different speeds drift apart for free)",
                    r::kNonNegative},
        &C::ring, u32);
  visit(ServeOption{"ring_memory", "Stream",
                    "shared memory for a ring sized by memory, e.g. 512MiB (default: 1 GiB, at "
                    "most 1/16 of available memory and 1/4 of free /dev/shm)",
                    r::kAny, Check::kByteSize},
        &C::ring_memory, u64);
  visit(ServeOption{"rank", "Stream", "this server's shard (DistributedSampler semantics)", r::kAny,
                    Check::kNone, "RANK"},
        &C::rank, u32);
  visit(ServeOption{"world_size", "Stream", "number of shards", r::kPositive, Check::kNone,
                    "WORLD_SIZE"},
        &C::world_size, u32);
  visit(ServeOption{"every_rank", "Stream",
                    "serve every rank's shard from this process (one node-wide server for DDP "
                    "jobs): rank r listens on ENDPOINT.rank<r> (tcp: PORT + r), its pool on the "
                    "(r mod G)-th GPU of --device"},
        &C::every_rank, flag);
  visit(ServeOption{"stall_policy", "Stream",
                    "decouple (a consumer holding the stream back reads what it missed as "
                    "regenerated chunks, nothing lost), wait (everyone waits for the slowest) or "
                    "skip (an idle consumer is left behind, what it misses counted)"},
        &C::stall_policy, &ServeConfig::kStallPolicies);
  visit(ServeOption{"stall_timeout", "Stream",
                    "seconds a consumer may hold the stream back before decouple frees the others "
                    "(skip: may ask for nothing before it is left behind); a stream stalled this "
                    "long is logged with who holds what",
                    r::kPositive},
        &C::stall_timeout, real);
  visit(ServeOption{"order", "Stream",
                    "the order of trainers that leave it to the server: exact (the stream's seeded "
                    "order) or relaxed (each epoch its shard once, in an order the server chooses "
                    "so that one decode serves every trainer that still needs a sample; batches "
                    "are copies); a trainer may ask for either (Loader(order=))"},
        &C::order, &ServeConfig::kOrders);
  visit(ServeOption{"fail_linger", "Stream",
                    "after a stream failure, seconds to keep answering trainers with the error "
                    "before exiting 1",
                    r::kNonNegative},
        &C::fail_linger, real);
  visit(ServeOption{"views", "Pipeline",
                    "a further view of the stream, served from its first chunk (repeat for more): "
                    "FIELD=VALUE,... over the transform (the other Pipeline options; docs/views.md)",
                    r::kAny, Check::kViewText, nullptr, "--view"},
        &C::views, texts);
  visit(ServeOption{"workers", "Pipeline", "decoding threads", r::kPositive}, &C::workers, u32);
  visit(ServeOption{"cache", "Pipeline",
                    "off, or decoded: keep each image decoded (shrunk to --cache-side) after its "
                    "first decode, and make every later epoch's views from it without reading or "
                    "decoding the file (docs/views.md, Decoded cache)"},
        &C::cache, &ServeConfig::kCaches);
  visit(ServeOption{"cache_side", "Pipeline",
                    "the cached images' shorter side in pixels, never enlarged (0: the largest "
                    "view's eval resize, 256 for 224-px views); a larger view is decoded from the "
                    "files",
                    r::kNonNegative},
        &C::cache_side, u32);
  visit(ServeOption{"cache_memory", "Pipeline",
                    "memory the decoded cache may take, e.g. 8GiB (default: half of the available "
                    "memory and of the free /dev/shm); the images that do not fit are decoded each "
                    "epoch",
                    r::kAny, Check::kByteSize},
        &C::cache_memory, u64);
  visit(ServeOption{"device", "GPU",
                    "where the pool lives: cpu, GPU K as cuda:K, or a GPU or MIG instance by its "
                    "UUID (nvidia-smi -L); several GPUs (cuda:0,cuda:1, or all) each get every "
                    "chunk, and each consumer reads on its own",
                    r::kAny, Check::kDevice},
        &C::device, text);
  visit(ServeOption{"decoder", "GPU",
                    "cpu (TurboJPEG/libjpeg), nvjpeg (the GPU's JPEG decoder; needs --device "
                    "cuda:K) or mixed (the --workers decode on the CPU what they keep up with, "
                    "nvJPEG the rest; for 4 or more GPU-bound trainers sharing the GPU; with 1-2 on "
                    "few cores use nvjpeg: docs/architecture.md)"},
        &C::decoder, &ServeConfig::kDecoders);
  visit(ServeOption{"metrics_dir", "Metrics and logs",
                    "write CPU/throughput metrics (CSV + summary.json) here", r::kAny,
                    Check::kNone, "BATCHCAST_METRICS_DIR"},
        &C::metrics_dir, text);
  visit(ServeOption{"metrics_interval", "Metrics and logs", "seconds between metric samples",
                    r::kPositive},
        &C::metrics_interval, real);
  visit(ServeOption{"status_interval", "Metrics and logs",
                    "seconds between status lines (0: none)", r::kNonNegative},
        &C::status_interval, real);
}

// A view field as a serve option of the transform: group Pipeline (the seed: Stream, as the
// stream's seed), --NAME from its PipelineOptions name (train: --eval, which sets it false).
ServeOption view_field_option(const ViewField& field);

}  // namespace batchcast
