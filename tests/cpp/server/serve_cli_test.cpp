// serve_command_line() is the way back from a ServeConfig to `batchcast serve`'s arguments (what
// batchcast.serve() runs): the command line must rebuild every setting exactly.
#include "server/serve/serve_cli.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "server/serve/ring_size.h"
#include "server/serve/serve_options.h"

namespace batchcast {
namespace {

ServeConfig parse(const std::vector<std::string>& args) {
  ServeConfig config;
  CLI::App app{"batchcast serve"};
  add_serve_options(&app, config);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 parses from the back
  app.parse(reversed);
  return config;
}

// Every setting the command line has, away from its default.
ServeConfig unusual() {
  ServeConfig c;
  c.data = "/tmp";
  c.on_error = OnErrorPolicy::kSkip;
  c.endpoint = "tcp://127.0.0.1:5999";
  c.listen_all = true;
  c.batch_size = 7;
  c.ring = 3;
  c.ring_memory = uint64_t{3} << 29;
  c.workers = c.workers + 5;
  c.min_consumers = 2;
  c.device = "cuda:1";
  c.decoder = DecoderKind::kMixed;
  c.epochs = 0;
  c.shuffle = false;
  c.rank = 1;
  c.world_size = 3;
  c.every_rank = true;
  c.stall_policy = StallPolicy::kWait;
  c.stall_timeout = 0.25;
  c.order = protocol::Order::kRelaxed;
  c.cache = CacheKind::kDecoded;
  c.cache_side = 300;
  c.cache_memory = uint64_t{3} << 30;
  c.metrics_dir = "/tmp/m";
  c.metrics_interval = 0.2;
  c.status_interval = 0;
  c.fail_linger = 1.5;
  c.views = {"size=24,crop=center", "size=16,scale=0.5:1,seed=3"};
  PipelineOptions& t = c.transform;
  t.image_size = 33;
  t.train = false;
  t.scale = {0.1, 0.7};
  t.ratio = {0.3, 3.0};
  t.flip_p = 0.123456789012345;
  t.resize_size = 40;
  t.interpolation = Interpolation::kNearest;
  t.output = DType::kUInt8;
  t.uint8_layout = Uint8Layout::kCHW;
  t.mean = {0.1f, 0.2f, 0.3f};
  t.std = {0.4f, 0.5f, 0.6f};
  t.seed = 1234567890123ull;
  return c;
}

TEST(ServeCliTest, DefaultsNeedNoArguments) {
  EXPECT_TRUE(serve_command_line(ServeConfig{}).empty());
}

// Every option of the lists (serve_options.h) is away from its default in unusual() (the other
// sources than --data in the next test), and the command line gives it back exactly: an option
// added to the lists fails here until unusual() sets it.
TEST(ServeCliTest, CommandLineRebuildsEverySetting) {
  const ServeConfig c = unusual();
  const ServeConfig d;
  const ServeConfig r = parse(serve_command_line(c));
  const std::set<std::string> other_sources = {"file_list", "synthetic", "sample_bytes"};
  for_each_serve_setting([&](const ServeOption& o, auto member, auto) {
    if (!other_sources.count(o.name)) {
      EXPECT_NE(c.*member, d.*member) << o.name << ": give it an unusual value above";
    }
    EXPECT_EQ(r.*member, c.*member) << o.name;
  });
  // Floats exact too: numbers are written in their shortest exact form.
  for_each_view_field([&](const ViewField& f, auto member, auto) {
    EXPECT_NE(c.transform.*member, d.transform.*member) << f.option << ": give it an unusual value";
    EXPECT_EQ(r.transform.*member, c.transform.*member) << f.option;
  });
}

TEST(ServeCliTest, SyntheticCommandLineRebuildsItsSource) {
  ServeConfig c;
  c.synthetic = 100;
  c.sample_bytes = 32;
  const ServeConfig r = parse(serve_command_line(c));
  EXPECT_EQ(r.synthetic, 100u);
  EXPECT_EQ(r.sample_bytes, 32u);
  c = ServeConfig{};
  c.file_list = "/etc/os-release";
  EXPECT_EQ(parse(serve_command_line(c)).file_list, "/etc/os-release");
}

// A bad view is refused by the command line, naming the field.
TEST(ServeCliTest, ABadViewIsRefusedNamingTheField) {
  try {
    parse({"--view", "size=0", "--data", "/tmp"});
    FAIL() << "no throw";
  } catch (const CLI::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("size must be in 1..16384"), std::string::npos)
        << e.what();
  }
}

// The GPU decoders serve views but resize bilinearly only: a view asking for another
// interpolation is refused with the other options, before any GPU is looked for.
TEST(ServeCliTest, TheGpuDecodersRefuseAViewTheyCannotResizeNamingIt) {
  for (const std::string decoder : {"nvjpeg", "mixed"}) {
    ServeConfig c = parse({"--view", "size=24,interpolation=nearest", "--decoder", decoder,
                           "--device", "cuda:0", "--data", "/tmp"});
    try {
      c.validate();
      FAIL() << "no throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("view 'size=24,interpolation=nearest': --decoder " +
                                           decoder + " resizes bilinearly"),
                std::string::npos)
          << e.what();
    }
    auto decodable = [&c](const std::string& text) {
      return ViewSet::decodable(text, c.transform_view(), c.staging(), c.decoder_flag());
    };
    EXPECT_EQ(decodable("size=24").options().image_size, 24);
    EXPECT_THROW(decodable("interpolation=nearest"), Error);
  }
  ServeConfig cpu = parse({"--view", "size=24,interpolation=nearest", "--data", "/tmp"});
  EXPECT_EQ(ViewSet::decodable("interpolation=nearest", cpu.transform_view(), cpu.staging(),
                               cpu.decoder_flag())
                .options()
                .interpolation,
            Interpolation::kNearest);
}

TEST(ServeCliTest, RingMemoryTakesSizesWithUnits) {
  EXPECT_EQ(parse({"--ring-memory", "512MiB"}).ring_memory, uint64_t{512} << 20);
  EXPECT_EQ(parse({"--ring-memory", "2G"}).ring_memory, uint64_t{2} << 30);
  EXPECT_THROW(parse({"--ring-memory", "lots"}), CLI::ParseError);
}

// The rule of a ring sized by memory, on made-up hosts.
TEST(RingSize, TheBudgetIsAGibibyteUnlessTheHostIsShortOfMemoryOrShm) {
  constexpr uint64_t GiB = uint64_t{1} << 30;
  EXPECT_EQ(default_ring_memory({64 * GiB, 32 * GiB}), GiB);
  EXPECT_EQ(default_ring_memory({8 * GiB, 32 * GiB}), GiB / 2) << "a sixteenth of available";
  EXPECT_EQ(default_ring_memory({64 * GiB, GiB}), GiB / 4) << "a quarter of free /dev/shm";
  EXPECT_EQ(default_ring_memory({0, 0}), GiB) << "what cannot be read does not limit it";
}

// A ring never holds more than an epoch behind the producer's lead, whatever the budget.
TEST(RingSize, NoMoreSlotsThanAnEpochAndTheLead) {
  EXPECT_EQ(ring_slots_for(uint64_t{1} << 30, 1 << 20, 10), 10 + kRingLeadChunks);
  EXPECT_EQ(ring_slots_for(uint64_t{1} << 30, 1 << 20, 0), 1024u) << "no epoch bound";
  EXPECT_EQ(ring_slots_for(20 << 20, 1 << 20, 500), 20u) << "the budget, below an epoch";
  EXPECT_EQ(ring_slots_for(1 << 20, 1 << 20, 1), kMinRingSlots) << "never below the floor";
}

TEST(RingSize, SlotsAreWhatTheBudgetHoldsWithinTheOldRingAndTheCap) {
  EXPECT_EQ(ring_slots_for(100 << 20, 1 << 20), 100u);
  EXPECT_EQ(ring_slots_for(100 << 20, 50 << 20), kMinRingSlots) << "never fewer than before";
  EXPECT_EQ(ring_slots_for(uint64_t{1} << 30, 1024), kMaxRingSlots);
}

// --order is a choice of exact and relaxed, and it is the order the stream host gives the
// consumers that leave theirs to the server.
TEST(ServeCliTest, OrderIsTheServersDefaultForItsConsumers) {
  EXPECT_EQ(parse({"--order", "relaxed"}).order, protocol::Order::kRelaxed);
  EXPECT_THROW(parse({"--order", "server"}), CLI::ParseError);
  EXPECT_THROW(parse({"--order", "sideways"}), CLI::ParseError);
  ServeConfig c;
  c.synthetic = 100;
  c.validate();
  const std::vector<SampleTensor> tensors = {{"#0", DType::kUInt8, {16}}};
  EXPECT_EQ(c.server_options(tensors, 100, 0).default_order, protocol::Order::kExact);
  c.order = protocol::Order::kRelaxed;
  c.validate();
  EXPECT_EQ(c.server_options(tensors, 100, 0).default_order, protocol::Order::kRelaxed);
  c.order = protocol::Order::kServer;
  EXPECT_THROW(c.validate(), Error) << "the server's default cannot be the server's default";
}

TEST(ServeCliTest, ASettingWithoutAnOptionIsAnError) {
  ServeConfig c;
  c.transform.max_image_pixels = 10;
  EXPECT_THROW(serve_command_line(c), Error);
}

}  // namespace
}  // namespace batchcast
