#include "server/serve/serve_cli.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <sstream>
#include <type_traits>

#include "common/error.h"
#include "common/named.h"
#include "decoders/view.h"
#include "server/serve/serve_options.h"

namespace batchcast {
namespace {

// A number for which `rule` holds; otherwise "must be RULE (got TEXT)".
CLI::Validator number_that(const ValueRule& rule) {
  return CLI::Validator(
      [rule](std::string& text) -> std::string {
        if (std::string err = CLI::Number(text); !err.empty()) return err;
        return rule.holds(std::stod(text)) ? std::string()
                                           : std::string("must be ") + rule.words + " (got " +
                                                 text + ")";
      },
      rule.words ? rule.words : "NUMBER");
}

// The forms shm/device_identity.h parses (whether the device exists is validate()'s check).
const CLI::Validator kDevice([](std::string& device) { return device_list_error(device); },
                             "cpu|cuda[:K]|GPU-<uuid>|MIG-<uuid>[,...]|all");

// A view's text (decoders/view.h): the error names the field.
const CLI::Validator kViewText(
    [](std::string& text) -> std::string {
      try {
        View::parse(text);
      } catch (const Error& e) {
        return e.what();
      }
      return {};
    },
    "FIELD=VALUE,...");

template <typename T>
struct IsArray : std::false_type {};
template <typename T, size_t N>
struct IsArray<std::array<T, N>> : std::true_type {};

// A value as the command line writes it: numbers in their shortest exact form.
template <typename T>
std::string arg_text(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else if constexpr (IsArray<T>::value) {
    std::string out;
    for (size_t i = 0; i < value.size(); ++i) out += (i ? "," : "") + arg_text(value[i]);
    return out;
  } else {
    return number_text(value);
  }
}

// One option bound to `value` on `cmd`, by its type: choices by name, bools as flags, fixed
// counts of numbers as A,B,C, lists repeated, the rest as one value checked by its rule.
template <typename T, typename Names>
void add_bound(CLI::App* cmd, const ServeOption& o, T& value, const Names* names) {
  const std::string flag = o.flag_text();
  CLI::Option* opt = nullptr;
  if constexpr (std::is_same_v<T, bool>) {
    if (o.inverted)
      opt = cmd->add_flag_callback(flag, [&value] { value = false; }, o.help);
    else if (value)  // on by default: --no-NAME turns it off
      opt = cmd->add_flag(flag + ",!--no-" + flag.substr(2), value, o.help);
    else
      opt = cmd->add_flag(flag, value, o.help);
  } else if constexpr (IsArray<T>::value) {
    opt = cmd->add_option_function<std::vector<typename T::value_type>>(
                 flag, [&value](const auto& v) { std::copy(v.begin(), v.end(), value.begin()); },
                 o.help)
              ->expected(static_cast<int>(value.size()))
              ->delimiter(',')
              ->check(number_that(o.rule))
              ->default_str(arg_text(value));
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    opt = cmd->add_option(flag, value,
                          std::string(o.help) + "; fields: " + view_field_names() +
                              " (seed default: derived from --seed and the view)");
  } else if constexpr (std::is_same_v<T, std::string> || std::is_arithmetic_v<T>) {
    opt = cmd->add_option(flag, value, o.help);
    if constexpr (std::is_arithmetic_v<T>)
      if (o.check != ServeOption::Check::kByteSize) opt->check(number_that(o.rule));
    if (o.check == ServeOption::Check::kByteSize)
      opt->transform(CLI::AsSizeValue(false))->default_str("auto");
    else
      opt->capture_default_str();
  } else {
    opt = add_choice(cmd, flag, value, *names, o.help);
  }
  switch (o.check) {
    case ServeOption::Check::kExistingDirectory:
      opt->check(CLI::ExistingDirectory);
      break;
    case ServeOption::Check::kExistingFile:
      opt->check(CLI::ExistingFile);
      break;
    case ServeOption::Check::kDevice:
      opt->check(kDevice);
      break;
    case ServeOption::Check::kViewText:
      opt->check(kViewText);
      break;
    case ServeOption::Check::kNone:
    case ServeOption::Check::kByteSize:
      break;
  }
  if (o.env) opt->envname(o.env);
  opt->group(o.group);
}

// `value`'s arguments where it differs from `fallback`.
template <typename T, typename Names>
void put_args(std::vector<std::string>& args, const ServeOption& o, const T& value, const T& fallback,
         const Names* names) {
  if (value == fallback) return;
  const std::string flag = o.flag_text();
  if constexpr (std::is_same_v<T, bool>) {
    args.push_back(o.inverted || !value ? (o.inverted ? flag : "--no-" + flag.substr(2)) : flag);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    for (const auto& item : value) args.insert(args.end(), {flag, item});
  } else if constexpr (std::is_same_v<T, std::string> || std::is_arithmetic_v<T> ||
                       IsArray<T>::value) {
    args.insert(args.end(), {flag, arg_text(value)});
  } else {
    auto name = name_of(value, *names);
    if (!name) throw Error("a setting has no command-line name");  // every table names every value
    args.insert(args.end(), {flag, *name});
  }
}

}  // namespace

std::string ServeOption::flag_text() const {
  if (flag) return flag;
  std::string out = std::string("--") + name;
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

ServeOption view_field_option(const ViewField& f) {
  ServeOption o{f.option, "Pipeline", f.help, f.rule};
  if (std::string(f.name) == "seed") o.group = "Stream";
  if (std::string(f.name) == "crop") {
    o.flag = "--eval";
    o.inverted = true;
    o.help = "Resize + CenterCrop instead of RandomResizedCrop + flip";
  }
  return o;
}

const CLI::Validator kPositive = number_that(view_rules::kPositive);
const CLI::Validator kNonNegative = number_that(view_rules::kNonNegative);

void add_serve_options(CLI::App* cmd, ServeConfig& c) {
  for_each_serve_setting([&](const ServeOption& o, auto member, auto names) {
    add_bound(cmd, o, c.*member, names);
  });
  for_each_view_field([&](const ViewField& f, auto member, auto names) {
    add_bound(cmd, view_field_option(f), c.transform.*member, names);
  });
  // Each source excludes the others; validate() requires one and says which to give.
  CLI::Option* data = cmd->get_option("--data");
  CLI::Option* list = cmd->get_option("--file-list");
  CLI::Option* synthetic = cmd->get_option("--synthetic");
  data->excludes(list)->excludes(synthetic);
  list->excludes(synthetic);
  cmd->option_defaults()->group("Options");  // what is added later (--help, --version)
}

std::vector<std::string> serve_command_line(const ServeConfig& c) {
  const ServeConfig d;  // what each option defaults to: only what differs is written
  std::vector<std::string> args;
  for_each_serve_setting([&](const ServeOption& o, auto member, auto names) {
    put_args(args, o, c.*member, d.*member, names);
  });
  for_each_view_field([&](const ViewField& f, auto member, auto names) {
    put_args(args, view_field_option(f), c.transform.*member, d.transform.*member, names);
  });
  if (c.transform.max_image_pixels != d.transform.max_image_pixels)
    throw Error("max_image_pixels has no command-line option: leave it at its default");
  return args;
}

}  // namespace batchcast
