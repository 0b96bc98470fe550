// The command line of a Kuafu app: `kuafu-gpt <subcommand> --config PATH [--set KEY=VALUE]... [options]`.
// Declares subcommands and their options, parses argv with Boost.Program_options, and prints help.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace kuafu::config {

struct ParsedCommand {
  std::string subcommand;                      // empty when only program help was asked for
  std::string config_path;                     // --config
  std::vector<std::string> overrides;          // every --set, in order; pass to Config::load
  bool print_config = false;                   // --print-config
  bool help = false;                           // --help, or no arguments: print help() and exit 0
  std::map<std::string, std::string> options;  // every declared option, given or default
  std::set<std::string> flags;                 // the flags given

  // An undeclared option name is a programming error: kuafu::Error.
  std::string option(const std::string& name) const;
  bool flag(const std::string& name) const { return flags.count(name) > 0; }
};

class CommandLine {
 public:
  CommandLine(std::string program, std::string description);

  // Every subcommand gets --config PATH (required), --set KEY=VALUE (repeatable), --print-config, --help.
  CommandLine& subcommand(const std::string& name, const std::string& help);
  // --name VALUE_NAME, e.g. option("generate", "prompt", "TEXT", "", "text to continue").
  CommandLine& option(const std::string& subcommand, const std::string& name, const std::string& value_name,
                      const std::string& default_value, const std::string& help);
  // --name without a value.
  CommandLine& flag(const std::string& subcommand, const std::string& name, const std::string& help);

  // Throws kuafu::Error naming the bad subcommand or option, with a usage hint.
  ParsedCommand parse(int argc, const char* const argv[]) const;

  std::string help() const;                               // the program and its subcommands
  std::string help(const std::string& subcommand) const;  // one subcommand's options

 private:
  struct Option {
    std::string name, value_name, default_value, help;
    bool is_flag = false;
  };
  struct Subcommand {
    std::string name, help;
    std::vector<Option> options;  // declaration order, for help
  };

  const Subcommand& find(const std::string& name) const;  // throws with did-you-mean
  Subcommand& find_mutable(const std::string& name);
  void add(const std::string& subcommand, Option option);

  std::string program_, description_;
  std::vector<Subcommand> subcommands_;  // declaration order, for help
};

}  // namespace kuafu::config
