#include "core/train/app.h"

#include <iostream>

#include "core/train/runtime.h"
#include "core/util/error.h"

namespace kuafu::train {

int run_app(const std::string& program, const config::CommandLine& cli, const config::Schema& schema,
            const std::map<std::string, AppCommand>& commands, int argc, const char* const argv[]) {
  return run_app_command(program, [&] {
    const config::ParsedCommand command = cli.parse(argc, argv);
    if (command.help) {
      std::cout << (command.subcommand.empty() ? cli.help() : cli.help(command.subcommand));
      return;
    }
    const auto found = commands.find(command.subcommand);
    KUAFU_CHECK(found != commands.end(), program, " declares subcommand \"", command.subcommand, "\" but has no code for it");
    const config::Config config = config::Config::load(command.config_path, schema, command.overrides);
    if (command.print_config) {
      std::cout << config.to_toml();
      return;
    }
    found->second(config, command);
  });
}

}  // namespace kuafu::train
