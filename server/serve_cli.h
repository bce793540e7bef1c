// The `batchcast serve` command line: its options (CLI11; each option checked on its own, with
// validators) and parse_serve_args(), which reads the same options from a list of strings for
// callers that are not main() (the Python bindings' RunningServer, which the share producer of
// batchcast.DataLoader runs). One table of options, whichever way the server is started.
//
// Thread-safety: add_serve_options() binds the options to `c` (which must outlive the parse);
// parse_serve_args() is a pure function of its arguments and the environment (RANK,
// WORLD_SIZE, BATCHCAST_METRICS_DIR are read as the command line reads them).
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

#include "server/serve_config.h"

namespace batchcast {

// An option whose value is one of `choices` (by name): CLI11 rejects any other value with an
// error listing the valid ones, and help shows the default.
template <typename T>
CLI::Option* add_choice(CLI::App* cmd, const std::string& name, T& value,
                        const std::map<std::string, T>& choices, const std::string& help) {
  std::string default_name;
  for (const auto& [key, v] : choices)
    if (v == value) default_name = key;
  return cmd
      ->add_option_function<std::string>(
          name, [&value, &choices](const std::string& s) { value = choices.at(s); }, help)
      ->check(CLI::IsMember(choices))
      ->default_str(default_name);
}

// A number greater than 0 / at least 0. CLI11's PositiveNumber and NonNegativeNumber state their
// bounds as the limits of a double (a 309-digit number) when a value is out of range; these say
// the rule in words: "--batch-size: must be greater than 0 (got 0)".
extern const CLI::Validator kPositive;
extern const CLI::Validator kNonNegative;

// The serve options in groups, as `serve --help` shows them: data, pipeline, stream, GPU, metrics.
void add_serve_options(CLI::App* cmd, ServeConfig& c);

// The ServeConfig of `batchcast serve ARGS...` (ARGS without the program and subcommand
// names), validated. Throws Error with CLI11's message for a bad option, or validate()'s.
ServeConfig parse_serve_args(const std::vector<std::string>& args);

}  // namespace batchcast
