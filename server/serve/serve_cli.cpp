#include "server/serve/serve_cli.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <sstream>
#include <type_traits>

#include "common/error.h"
#include "decoders/view_spec.h"

namespace batchcast {
namespace {

// A fixed count of numbers, given as --name A,B,C (or space-separated); `each` checks every one.
template <typename T, size_t N>
CLI::Option* add_numbers(CLI::App* cmd, const std::string& name, std::array<T, N>& value,
                         const CLI::Validator& each, const std::string& help) {
  std::ostringstream default_text;
  for (size_t i = 0; i < N; ++i) default_text << (i ? "," : "") << value[i];
  return cmd
      ->add_option_function<std::vector<T>>(
          name, [&value](const std::vector<T>& v) { std::copy(v.begin(), v.end(), value.begin()); },
          help)
      ->expected(static_cast<int>(N))
      ->delimiter(',')
      ->check(each)
      ->default_str(default_text.str());
}

// A number other than 0 (a divisor).
const CLI::Validator kNonZero(
    [](std::string& text) -> std::string {
      if (std::string err = CLI::Number(text); !err.empty()) return err;
      return std::stod(text) != 0.0 ? std::string() : text + " divides: it must not be 0";
    },
    "NONZERO");

// The forms shm/device_identity.h parses (whether the device exists is validate()'s check).
const CLI::Validator kDevice([](std::string& device) { return device_list_error(device); },
                             "cpu|cuda[:K]|GPU-<uuid>|MIG-<uuid>[,...]|all");

// A view's text (decoders/view_spec.h): the error names the field.
const CLI::Validator kViewSpec(
    [](std::string& text) -> std::string {
      try {
        parse_view_spec(text);
      } catch (const Error& e) {
        return e.what();
      }
      return {};
    },
    "FIELD=VALUE,...");

// A number for which `holds` is true; otherwise "must be RULE (got TEXT)".
CLI::Validator number_that(bool (*holds)(double), const std::string& rule,
                           const std::string& name) {
  return CLI::Validator(
      [holds, rule](std::string& text) -> std::string {
        if (std::string err = CLI::Number(text); !err.empty()) return err;
        return holds(std::stod(text)) ? std::string() : "must be " + rule + " (got " + text + ")";
      },
      rule, name);
}

}  // namespace

const CLI::Validator kPositive =
    number_that([](double v) { return v > 0; }, "greater than 0", "POSITIVE");
const CLI::Validator kNonNegative =
    number_that([](double v) { return v >= 0; }, "0 or more", "NONNEGATIVE");

void add_serve_options(CLI::App* cmd, ServeConfig& c) {
  // Options added after group(NAME) are listed under NAME in --help.
  auto group = [cmd](const char* name) { cmd->option_defaults()->group(name); };
  group("Data");
  // Each source excludes the others; validate() requires one and says which to give.
  auto* data = cmd->add_option("--data", c.data, "image folder (torchvision ImageFolder layout)")
                   ->check(CLI::ExistingDirectory);
  auto* list = cmd->add_option("--file-list", c.file_list, "text file of 'path label' lines")
                   ->check(CLI::ExistingFile);
  auto* synthetic =
      cmd->add_option("--synthetic", c.synthetic, "serve N synthetic samples (tests, benchmarks)")
          ->check(kPositive);
  data->excludes(list)->excludes(synthetic);
  list->excludes(synthetic);
  cmd->add_option("--sample-bytes", c.sample_bytes, "bytes per synthetic sample")
      ->check(kPositive)
      ->capture_default_str();
  group("Stream");
  cmd->add_option("--endpoint", c.endpoint,
                  "ipc://PATH or tcp://HOST:PORT (default ipc:///tmp/batchcast-UID.sock)");
  cmd->add_flag("--listen-all", c.listen_all,
                "let tcp://*:PORT listen on every interface, not only loopback");
  cmd->add_option("--batch-size", c.batch_size, "samples per chunk; consumers' default batch size")
      ->check(kPositive)
      ->capture_default_str();
  group("Pipeline");
  cmd->add_option("--image-size", c.transform.image_size, "output side in pixels")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_flag_callback(
      "--eval", [&c] { c.transform.train = false; },
      "Resize + CenterCrop instead of RandomResizedCrop + flip");
  add_numbers(cmd, "--mean", c.transform.mean, CLI::Number, "Normalize mean per RGB channel");
  add_numbers(cmd, "--std", c.transform.std, kNonZero, "Normalize std per RGB channel");
  add_numbers(cmd, "--scale", c.transform.scale, kNonNegative,
              "RandomResizedCrop area fraction range MIN,MAX");
  add_numbers(cmd, "--ratio", c.transform.ratio, kPositive,
              "RandomResizedCrop aspect ratio range MIN,MAX");
  cmd->add_option("--flip-p", c.transform.flip_p, "probability of the horizontal flip (training)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--resize-size", c.transform.resize_size,
                  "eval: shorter side before the centred crop (0: image size * 256 / 224)")
      ->check(kNonNegative)
      ->capture_default_str();
  add_choice(cmd, "--interpolation", c.transform.interpolation, kInterpolationNames,
             "resize filter: bilinear or nearest (nearest: CPU decoder only)");
  add_choice(cmd, "--uint8-layout", c.transform.uint8_layout, kUint8LayoutNames,
             "uint8 samples as hwc (S,S,3) or chw (3,S,S, as PILToTensor)");
  cmd->add_option("--view", c.views,
                  "a further view of the stream, served from its first chunk (repeat for more): "
                  "FIELD=VALUE,... over the transform above, fields size, crop (random|center), "
                  "scale and ratio (MIN:MAX), flip, resize, interpolation, output, layout, mean "
                  "and std (R:G:B), seed (default: derived from --seed and the view); "
                  "docs/views.md")
      ->check(kViewSpec);
  cmd->add_option("--workers", c.workers, "decoding threads")
      ->check(kPositive)
      ->capture_default_str();
  group("GPU");
  cmd->add_option(
         "--device", c.device,
         "where the pool lives: cpu, GPU K as cuda:K, or a GPU or MIG instance by its UUID "
         "(nvidia-smi -L); several GPUs (cuda:0,cuda:1, or all) each get every chunk, and each "
         "consumer reads on its own")
      ->check(kDevice)
      ->capture_default_str();
  add_choice(cmd, "--decoder", c.decoder, ServeConfig::kDecoders,
             "cpu (TurboJPEG/libjpeg), nvjpeg (the GPU's JPEG decoder; needs --device cuda:K) or "
             "mixed (the --workers decode on the CPU what they keep up with, nvJPEG the rest; "
             "for 4 or more GPU-bound trainers sharing the GPU; with 1-2 on few cores use nvjpeg: "
             "docs/architecture.md)");
  group("Stream");
  cmd->add_option("--epochs", c.epochs, "epochs to serve (0: until stopped)")
      ->capture_default_str();
  cmd->add_option("--seed", c.transform.seed, "seed of shuffling and augmentation")
      ->capture_default_str();
  cmd->add_flag("--shuffle,!--no-shuffle", c.shuffle, "shuffle every epoch (default on)");
  cmd->add_option("--min-consumers", c.min_consumers,
                  "consumers to wait for before the stream starts")
      ->capture_default_str();
  group("Pipeline");
  add_choice(cmd, "--output", c.transform.output, kOutputNames,
             "float32, float16, bfloat16 (normalised) or uint8");
  group("Data");
  add_choice(cmd, "--on-error", c.on_error, ServeConfig::kOnError,
             "bad samples: raise (fail the stream) or skip (count them)");
  group("Stream");
  cmd->add_option("--ring", c.ring,
                  "slots in the shared pool (0: as many as --ring-memory holds, 8 on a GPU; the "
                  "window in which trainers of different speeds drift apart for free)")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--ring-memory", c.ring_memory,
                  "shared memory for a ring sized by memory, e.g. 512MiB (default: 1 GiB, at most "
                  "1/16 of available memory and 1/4 of free /dev/shm)")
      ->transform(CLI::AsSizeValue(false))
      ->default_str("auto");
  // Under torchrun (or any launcher that sets them) a server per rank shards by itself.
  cmd->add_option("--rank", c.rank, "this server's shard (DistributedSampler semantics)")
      ->envname("RANK")
      ->capture_default_str();
  cmd->add_option("--world-size", c.world_size, "number of shards")
      ->envname("WORLD_SIZE")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_flag("--every-rank", c.every_rank,
                "serve every rank's shard from this process (one node-wide server for DDP "
                "jobs): rank r listens on ENDPOINT.rank<r> (tcp: PORT + r), its pool on the "
                "(r mod G)-th GPU of --device");
  add_choice(cmd, "--stall-policy", c.stall_policy, ServeConfig::kStallPolicies,
             "decouple (a consumer holding the stream back reads what it missed as regenerated "
             "chunks, nothing lost), wait (everyone waits for the slowest) or skip (an idle "
             "consumer is left behind, what it misses counted)");
  cmd->add_option("--stall-timeout", c.stall_timeout,
                  "seconds a consumer may hold the stream back before decouple frees the others "
                  "(skip: may ask for nothing before it is left behind); a stream stalled this "
                  "long is logged with who holds what")
      ->check(kPositive)
      ->capture_default_str();
  group("Metrics and logs");
  // Under `batchcast track`, BATCHCAST_METRICS_DIR names the tracked run's directory, so a
  // server started there lands in the same run tree.
  cmd->add_option("--metrics-dir", c.metrics_dir,
                  "write CPU/throughput metrics (CSV + summary.json) here")
      ->envname("BATCHCAST_METRICS_DIR");
  cmd->add_option("--metrics-interval", c.metrics_interval, "seconds between metric samples")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--status-interval", c.status_interval, "seconds between status lines (0: none)")
      ->check(kNonNegative)
      ->capture_default_str();
  group("Stream");
  cmd->add_option("--fail-linger", c.fail_linger,
                  "after a stream failure, seconds to keep answering trainers with the error "
                  "before exiting 1")
      ->check(kNonNegative)
      ->capture_default_str();
  group("Options");  // what is added later (--help, --version)
}

namespace {

// A value as the command line takes it back: numbers in their shortest exact form.
template <typename T>
std::string arg_text(T value) {
  if constexpr (std::is_enum_v<T>) {
    static_assert(sizeof(T) == 0, "name enums through their table");
  } else {
    std::array<char, 64> buffer;
    auto end = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value).ptr;
    return std::string(buffer.data(), end);
  }
}
std::string arg_text(const std::string& value) { return value; }
template <typename T, size_t N>
std::string arg_text(const std::array<T, N>& values) {
  std::string out;
  for (size_t i = 0; i < N; ++i) out += (i ? "," : "") + arg_text(values[i]);
  return out;
}
template <typename T>
std::string name_of(T value, const std::map<std::string, T>& names) {
  for (const auto& [name, v] : names)
    if (v == value) return name;
  throw Error("a setting has no command-line name");  // every table names every value
}

}  // namespace

std::vector<std::string> serve_command_line(const ServeConfig& c) {
  const ServeConfig d;  // what each option defaults to: only what differs is written
  const PipelineOptions& t = c.transform;
  const PipelineOptions& dt = d.transform;
  std::vector<std::string> args;
  auto put = [&args](const char* flag, const auto& value, const auto& fallback) {
    if (value == fallback) return;
    args.push_back(flag);
    args.push_back(arg_text(value));
  };
  auto put_name = [&args](const char* flag, auto value, auto fallback, const auto& names) {
    if (value == fallback) return;
    args.push_back(flag);
    args.push_back(name_of(value, names));
  };
  auto put_flag = [&args](const char* flag, bool on) {
    if (on) args.push_back(flag);
  };
  put("--data", c.data, d.data);
  put("--file-list", c.file_list, d.file_list);
  put("--synthetic", c.synthetic, d.synthetic);
  put("--sample-bytes", c.sample_bytes, d.sample_bytes);
  put_name("--on-error", c.on_error, d.on_error, ServeConfig::kOnError);
  put("--endpoint", c.endpoint, d.endpoint);
  put_flag("--listen-all", c.listen_all);
  put("--batch-size", c.batch_size, d.batch_size);
  put("--epochs", c.epochs, d.epochs);
  put("--seed", t.seed, dt.seed);
  put_flag("--no-shuffle", !c.shuffle);
  put("--min-consumers", c.min_consumers, d.min_consumers);
  put("--ring", c.ring, d.ring);
  put("--ring-memory", c.ring_memory, d.ring_memory);
  put("--rank", c.rank, d.rank);
  put("--world-size", c.world_size, d.world_size);
  put_flag("--every-rank", c.every_rank);
  put_name("--stall-policy", c.stall_policy, d.stall_policy, ServeConfig::kStallPolicies);
  put("--stall-timeout", c.stall_timeout, d.stall_timeout);
  put("--fail-linger", c.fail_linger, d.fail_linger);
  put("--image-size", t.image_size, dt.image_size);
  put_flag("--eval", !t.train);
  put("--mean", t.mean, dt.mean);
  put("--std", t.std, dt.std);
  put("--scale", t.scale, dt.scale);
  put("--ratio", t.ratio, dt.ratio);
  put("--flip-p", t.flip_p, dt.flip_p);
  put("--resize-size", t.resize_size, dt.resize_size);
  put_name("--interpolation", t.interpolation, dt.interpolation, kInterpolationNames);
  put_name("--uint8-layout", t.uint8_layout, dt.uint8_layout, kUint8LayoutNames);
  put_name("--output", t.output, dt.output, kOutputNames);
  for (const auto& view : c.views) {
    args.push_back("--view");
    args.push_back(view);
  }
  put("--workers", c.workers, d.workers);
  put("--device", c.device, d.device);
  put_name("--decoder", c.decoder, d.decoder, ServeConfig::kDecoders);
  put("--metrics-dir", c.metrics_dir, d.metrics_dir);
  put("--metrics-interval", c.metrics_interval, d.metrics_interval);
  put("--status-interval", c.status_interval, d.status_interval);
  if (t.max_image_pixels != dt.max_image_pixels)
    throw Error("max_image_pixels has no command-line option: leave it at its default");
  return args;
}

}  // namespace batchcast
