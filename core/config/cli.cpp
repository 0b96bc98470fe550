// The command line of a Kuafu app: subcommands, their options, parsing and help.
#include "core/config/cli.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <sstream>

#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::config {
namespace po = boost::program_options;
namespace {

// Options every subcommand has; app options may not reuse these names.
const std::vector<std::string> kCommonOptions = {"config", "set", "print-config", "help"};

// The visible options of one subcommand (a template only so that it can take the private Subcommand).
template <typename Sub>
po::options_description options_of(const Sub& sub) {
  po::options_description desc("Options");
  // clang-format off
  desc.add_options()
      ("config", po::value<std::string>()->value_name("PATH"), "TOML config file (required)")
      ("set", po::value<std::vector<std::string>>()->value_name("KEY=VALUE"),
       "override a config value, e.g. --set train.lr=1e-3; repeatable")
      ("print-config", po::bool_switch(), "print the effective config, then exit")
      ("help,h", po::bool_switch(), "show this help");
  // clang-format on
  for (const auto& option : sub.options) {
    if (option.is_flag) {
      desc.add_options()(option.name.c_str(), po::bool_switch(), option.help.c_str());
      continue;
    }
    auto* value = po::value<std::string>()->value_name(option.value_name);
    if (!option.default_value.empty()) value->default_value(option.default_value);
    desc.add_options()(option.name.c_str(), value, option.help.c_str());
  }
  return desc;
}

}  // namespace

std::string ParsedCommand::option(const std::string& name) const {
  const auto it = options.find(name);
  KUAFU_CHECK(it != options.end(), "option '--", name, "' is not declared for subcommand '", subcommand, "'");
  return it->second;
}

CommandLine::CommandLine(std::string program, std::string description)
    : program_(std::move(program)), description_(std::move(description)) {}

CommandLine& CommandLine::subcommand(const std::string& name, const std::string& help) {
  KUAFU_CHECK(!name.empty() && name[0] != '-', "command line: bad subcommand name '", name, "'");
  for (const auto& sub : subcommands_) {
    KUAFU_CHECK(sub.name != name, "command line: subcommand '", name, "' is declared twice");
  }
  subcommands_.push_back({name, help, {}});
  return *this;
}

CommandLine& CommandLine::option(const std::string& subcommand, const std::string& name,
                                 const std::string& value_name, const std::string& default_value,
                                 const std::string& help) {
  add(subcommand, {name, value_name, default_value, help, false});
  return *this;
}

CommandLine& CommandLine::flag(const std::string& subcommand, const std::string& name,
                               const std::string& help) {
  add(subcommand, {name, "", "", help, true});
  return *this;
}

void CommandLine::add(const std::string& subcommand, Option option) {
  Subcommand& sub = find_mutable(subcommand);
  // Boost reads "a,b" as a long and a short name; keep names plain long options.
  KUAFU_CHECK(!option.name.empty() && option.name[0] != '-' && option.name.find(',') == std::string::npos,
              "command line: bad option name '", option.name, "'");
  const bool common = std::count(kCommonOptions.begin(), kCommonOptions.end(), option.name) > 0;
  const bool taken = std::any_of(sub.options.begin(), sub.options.end(),
                                 [&](const Option& o) { return o.name == option.name; });
  KUAFU_CHECK(!common && !taken, "command line: option '--", option.name, "' of '", subcommand,
              "' is declared twice");
  sub.options.push_back(std::move(option));
}

CommandLine::Subcommand& CommandLine::find_mutable(const std::string& name) {
  for (auto& sub : subcommands_) {
    if (sub.name == name) return sub;
  }
  fail("command line: subcommand '" + name + "' is not declared");
}

const CommandLine::Subcommand& CommandLine::find(const std::string& name) const {
  std::vector<std::string> names;
  for (const auto& sub : subcommands_) {
    if (sub.name == name) return sub;
    names.push_back(sub.name);
  }
  const std::string near = text::closest_match(name, names, 2);
  fail(program_ + ": unknown subcommand '" + text::abbreviate(name) + "'" +
       (near.empty() ? "" : "; did you mean '" + near + "'?") + "\nSubcommands: " + text::join(names, ", ") +
       "\nRun '" + program_ + " --help' for usage.");
}

ParsedCommand CommandLine::parse(int argc, const char* const argv[]) const {
  ParsedCommand result;
  // The subcommand is the first argument and everything after it belongs to it, so each subcommand's
  // options are parsed on their own.
  if (argc < 2) {
    result.help = true;
    return result;
  }
  const std::string first = argv[1];
  if (first == "--help" || first == "-h") {
    result.help = true;
    return result;
  }
  KUAFU_CHECK(!text::starts_with(first, "-"), program_, ": expected a subcommand before '", text::abbreviate(first),
              "'\nRun '", program_, " --help' for usage.");
  const Subcommand& sub = find(first);
  result.subcommand = sub.name;
  const std::string context = program_ + " " + sub.name;
  const std::string hint = "\nRun '" + context + " --help' for usage.";

  const po::options_description visible = options_of(sub);
  // Stray words are collected instead of letting Boost reject them without naming them.
  po::options_description all;
  all.add(visible).add_options()("positional", po::value<std::vector<std::string>>(), "");
  po::positional_options_description positional;
  positional.add("positional", -1);
  po::variables_map vm;
  try {
    // No prefix guessing: "--conf" must not silently mean "--config".
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    const std::vector<std::string> args(argv + 2, argv + argc);
    po::store(po::command_line_parser(args).options(all).positional(positional).style(style).run(), vm);
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    std::vector<std::string> names;
    for (const auto& option : visible.options())
      names.push_back(option->canonical_display_name(po::command_line_style::allow_long));
    const std::string near = text::closest_match(e.get_option_name(), names, 2);
    fail(context + ": unknown option '" + text::abbreviate(e.get_option_name()) + "'" +
         (near.empty() ? "" : "; did you mean '" + near + "'?") + hint);
  } catch (const po::error& e) {
    fail(context + ": " + text::abbreviate(e.what(), 200) + hint);
  }

  if (vm["help"].as<bool>()) {
    result.help = true;
    return result;
  }
  if (vm.count("positional")) {
    fail(context + ": unexpected argument '" + text::abbreviate(vm["positional"].as<std::vector<std::string>>()[0]) +
         "'" + hint);
  }
  KUAFU_CHECK(vm.count("config"), context, ": missing --config PATH (the TOML config file)", hint);
  result.config_path = vm["config"].as<std::string>();
  if (vm.count("set")) result.overrides = vm["set"].as<std::vector<std::string>>();
  result.print_config = vm["print-config"].as<bool>();
  for (const auto& option : sub.options) {
    if (option.is_flag) {
      if (vm[option.name].as<bool>()) result.flags.insert(option.name);
    } else {
      result.options[option.name] =
          vm.count(option.name) ? vm[option.name].as<std::string>() : option.default_value;
    }
  }
  return result;
}

std::string CommandLine::help() const {
  std::ostringstream out;
  out << program_ << ": " << description_ << "\n\nUsage: " << program_
      << " <subcommand> --config PATH [--set KEY=VALUE]... [options]\n\nSubcommands:\n";
  size_t width = 0;
  for (const auto& sub : subcommands_) width = std::max(width, sub.name.size());
  for (const auto& sub : subcommands_) {
    out << "  " << sub.name << std::string(width - sub.name.size() + 3, ' ') << sub.help << "\n";
  }
  out << "\nRun '" << program_ << " <subcommand> --help' for the options of a subcommand.\n";
  return out.str();
}

std::string CommandLine::help(const std::string& subcommand) const {
  const Subcommand& sub = find(subcommand);
  std::ostringstream out;
  out << "Usage: " << program_ << " " << sub.name << " --config PATH [--set KEY=VALUE]... [options]\n\n"
      << sub.help << "\n\n"
      << options_of(sub);
  return out.str();
}

}  // namespace kuafu::config
