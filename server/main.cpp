// batchcast: the native command line (CLI11). Subcommands: serve (serve.h; its options are
// serve_cli.h's, its settings serve_config.h's), make-dataset (decoders/make_dataset.h).
// `track`, `report`, `bench` and `sweep` are listed so that help shows them, but they belong to the Python
// package: its `batchcast` console script runs them and execs this program for everything else.
// The program calls itself `batchcast` whatever path it was started by (the package's copy lives
// in .../site-packages/batchcast/_bin/). spdlog logs to stderr: stdout stays for data (--help,
// --version).
#include <spdlog/cfg/env.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <string>

#include "decoders/make_dataset.h"
#include "server/serve/serve.h"
#include "server/serve/serve_cli.h"
#include "server/serve/serve_config.h"

namespace batchcast {
namespace {

const std::map<std::string, spdlog::level::level_enum> kLogLevels = {
    {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
    {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
    {"error", spdlog::level::err},   {"critical", spdlog::level::critical},
    {"off", spdlog::level::off}};

void add_make_dataset_options(CLI::App* cmd, MakeDatasetOptions& md) {
  cmd->add_option("--out", md.out_dir, "output folder (ImageFolder layout)")->required();
  cmd->add_option("--source", md.source_dir, "folder of photos (e.g. Debian's mate-backgrounds)")
      ->check(CLI::ExistingDirectory)
      ->capture_default_str();
  cmd->add_option("--classes", md.classes, "class folders")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--per-class", md.images_per_class, "images per class")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--seed", md.seed, "seed")->capture_default_str();
}

// A subcommand the Python package runs: here it only says so (exit 2).
CLI::App* add_python_command(CLI::App& app, const std::string& name, const std::string& help) {
  auto* cmd = app.add_subcommand(
      name, help + " (part of the Python package: python3 -m batchcast " + name + ")");
  // Whatever follows gets the message, not a parse error (nor a fall through to the top level).
  cmd->fallthrough(false)->allow_extras()->prefix_command();
  return cmd;
}

// No subcommand was recognised: say which were given and which exist (CLI11 says only that one
// is required). Exit 2, as other usage errors.
int command_error(const CLI::App& app) {
  std::string known;
  auto named = [](const CLI::App* c) { return !c->get_name().empty(); };
  for (const auto* cmd : app.get_subcommands(named))
    known += (known.empty() ? "" : ", ") + cmd->get_name();
  const auto rest = app.remaining();
  if (rest.empty())
    std::fprintf(stderr, "batchcast: give a command: %s (batchcast --help says more)\n",
                 known.c_str());
  else
    std::fprintf(stderr,
                 "batchcast: unknown command '%s': the commands are %s (batchcast --help says "
                 "more)\n",
                 rest.front().c_str(), known.c_str());
  return 2;
}

int python_command_error(const std::string& name) {
  spdlog::error(
      "batchcast {0} is part of the Python package: run `python3 -m batchcast {0} ...` "
      "(pip install puts a `batchcast` command on PATH that does this)",
      name);
  return 2;
}

}  // namespace
}  // namespace batchcast

int main(int argc, char** argv) {
  using namespace batchcast;
  CLI::App app{"batchcast: one shared data-loading server for collocated training jobs",
               "batchcast"};
  app.require_subcommand(1);
  app.fallthrough();  // subcommands inherit it: --log-level also works after the subcommand
  spdlog::level::level_enum log_level = spdlog::level::info;
  auto* level_opt = add_choice(&app, "--log-level", log_level, kLogLevels,
                               "trace, debug, info, warn, error, critical or off (default: "
                               "info, or SPDLOG_LEVEL's)");

  ServeConfig config;
  auto* serve_cmd = app.add_subcommand("serve", "decode a dataset once and serve its batches");
  add_serve_options(serve_cmd, config);
  MakeDatasetOptions md;
  auto* make_cmd =
      app.add_subcommand("make-dataset", "cut an ImageNet-like JPEG dataset from real photos");
  add_make_dataset_options(make_cmd, md);
  auto* track_cmd = add_python_command(
      app, "track", "record the metrics of any command: batchcast track [--workload W] -- CMD...");
  auto* report_cmd = add_python_command(app, "report", "plot metrics run directories (PNG + HTML)");
  auto* bench_cmd =
      add_python_command(app, "bench", "N collocated trainings, batchcast vs N DataLoaders");
  auto* sweep_cmd = add_python_command(
      app, "sweep", "run a sweep's trials collocated on the GPUs: batchcast sweep -- CMD {a,b}");

  const std::string version = "batchcast " BATCHCAST_VERSION;
  app.set_version_flag("--version", version);
  for (auto* cmd : {serve_cmd, make_cmd, track_cmd, report_cmd, bench_cmd, sweep_cmd})
    cmd->set_version_flag("--version", version);

  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    if (app.get_subcommands().empty()) return command_error(app);
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const CLI::ParseError& e) {
    // CLI11 prints help, the version or the error; every usage error exits 2, as errors below do.
    return app.exit(e) == 0 ? 0 : 2;
  }
  spdlog::set_default_logger(spdlog::stderr_color_mt("batchcast"));  // stdout stays for data
  spdlog::set_level(log_level);
  if (!level_opt->count()) spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug, say
  try {
    if (*serve_cmd) {
      config.validate();
      return serve(config);
    }
    if (*make_cmd) {
      auto r = make_dataset(md);
      spdlog::info("wrote {} images ({:.1f} MiB) in {} classes to {} from {} photos", r.images,
                   r.bytes / 1048576.0, r.classes, md.out_dir, r.sources);
      return 0;
    }
    if (*track_cmd) return python_command_error("track");
    if (*report_cmd) return python_command_error("report");
    if (*bench_cmd) return python_command_error("bench");
    if (*sweep_cmd) return python_command_error("sweep");
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 2;
  }
  return 0;
}
