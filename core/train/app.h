// The one main of every app: its subcommands on a config::CommandLine, the config loaded once and
// checked against the app's schema before any work, --help and --print-config, and every error reported
// as "<program>: error: ..." with exit code 1 (128 + the signal after a stop by SIGINT/SIGTERM).
#pragma once

#include <functional>
#include <map>
#include <string>

#include "core/config/cli.h"
#include "core/config/config.h"

namespace kuafu::train {

// A subcommand's work, given the loaded config and the parsed command line (its options).
using AppCommand = std::function<void(const config::Config& config, const config::ParsedCommand& command)>;

// Parses argv with `cli`, loads --config against `schema` and runs the subcommand's entry of `commands`
// (one per subcommand `cli` declares). Returns the process's exit code.
int run_app(const std::string& program, const config::CommandLine& cli, const config::Schema& schema,
            const std::map<std::string, AppCommand>& commands, int argc, const char* const argv[]);

}  // namespace kuafu::train
