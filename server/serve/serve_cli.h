// The `batchcast serve` command line, one front end of ServeConfig (serve_config.h), made from the
// option lists (serve_options.h): add_serve_options() binds a CLI11 option to each field (checked
// on its own with validators; --help's text), and serve_command_line() is the way back, the
// arguments that make the program build a given config (what a Python launcher runs in another
// process). In-process callers (the Python module's ServeRun) build a ServeConfig directly and use
// neither.
//
// Thread-safety: add_serve_options() binds the options to `c` (which must outlive the parse);
// serve_command_line() is a pure function of its argument.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

#include "common/named.h"
#include "server/serve/serve_config.h"

namespace batchcast {

// An option whose value is one of `choices` (by name): CLI11 rejects any other value with an
// error listing the valid ones, and help shows the default.
template <typename T>
CLI::Option* add_choice(CLI::App* cmd, const std::string& name, T& value,
                        const std::map<std::string, T>& choices, const std::string& help) {
  return cmd
      ->add_option_function<std::string>(
          name, [&value, &choices](const std::string& s) { value = choices.at(s); }, help)
      ->check(CLI::IsMember(choices))
      ->default_str(name_of(value, choices).value_or(""));
}

// A number greater than 0 / at least 0. CLI11's PositiveNumber and NonNegativeNumber state their
// bounds as the limits of a double (a 309-digit number) when a value is out of range; these say
// the rule in words: "--batch-size: must be greater than 0 (got 0)".
extern const CLI::Validator kPositive;
extern const CLI::Validator kNonNegative;

// Every serve option, in groups, as `serve --help` shows them: data, stream, pipeline, GPU, metrics.
void add_serve_options(CLI::App* cmd, ServeConfig& c);

// The arguments of `batchcast serve` (after `serve`) that give `c`'s settings: each setting
// that differs from ServeConfig{}'s, so RANK, WORLD_SIZE and BATCHCAST_METRICS_DIR still apply
// where `c` leaves rank, world_size and metrics_dir at their defaults. Throws Error for a
// setting the command line has no option for (transform.max_image_pixels).
std::vector<std::string> serve_command_line(const ServeConfig& c);

}  // namespace batchcast
