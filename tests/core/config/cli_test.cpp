// Tests of the command-line layer: subcommands, --config/--set/--print-config, app options and flags,
// errors that name the bad argument, and help.
#include <gtest/gtest.h>

#include <initializer_list>

#include "core/config/cli.h"
#include "core/util/error.h"
#include "tests/support/test_util.h"

namespace kuafu::config {
namespace {

using testing::Contains;

CommandLine gpt_cli() {
  CommandLine cli("kuafu-gpt", "train and run GPT-style models");
  cli.subcommand("prepare", "tokenize a corpus into token files")
      .subcommand("train", "train a model")
      .subcommand("generate", "continue a prompt")
      .flag("train", "dry-run", "build everything, then stop before the first step")
      .option("generate", "prompt", "TEXT", "", "text to continue")
      .option("generate", "max-tokens", "N", "64", "tokens to generate");
  return cli;
}

ParsedCommand parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv = {"kuafu-gpt"};
  argv.insert(argv.end(), args.begin(), args.end());
  return gpt_cli().parse(static_cast<int>(argv.size()), argv.data());
}

// The message of the kuafu::Error that parsing throws ("" and a test failure if none is thrown).
std::string parse_error(std::initializer_list<const char*> args) {
  return testing::expected_error([&] { parse(args); });
}

TEST(CliTest, ParsesSubcommandAndConfig) {
  const ParsedCommand cmd = parse({"train", "--config", "quickstart.toml"});
  EXPECT_EQ(cmd.subcommand, "train");
  EXPECT_EQ(cmd.config_path, "quickstart.toml");
  EXPECT_FALSE(cmd.help);
  EXPECT_FALSE(cmd.print_config);
  EXPECT_TRUE(cmd.overrides.empty());
  EXPECT_FALSE(cmd.flag("dry-run"));
  EXPECT_EQ(parse({"prepare", "--config=data.toml"}).config_path, "data.toml");
}

TEST(CliTest, OptionsAndFlags) {
  const ParsedCommand gen = parse({"generate", "--config", "c.toml", "--prompt", "Once upon a time"});
  EXPECT_EQ(gen.option("prompt"), "Once upon a time");
  EXPECT_EQ(gen.option("max-tokens"), "64");  // the default
  EXPECT_EQ(parse({"generate", "--config", "c.toml", "--max-tokens=10"}).option("max-tokens"), "10");
  EXPECT_EQ(parse({"generate", "--config", "c.toml"}).option("prompt"), "");
  EXPECT_THROW(gen.option("temperature"), Error);

  const ParsedCommand train = parse({"train", "--dry-run", "--config", "c.toml", "--print-config"});
  EXPECT_TRUE(train.flag("dry-run"));
  EXPECT_EQ(train.flags.size(), 1u);
  EXPECT_TRUE(train.print_config);
}

TEST(CliTest, RepeatedSetKeepsOrder) {
  const ParsedCommand cmd = parse({"train", "--set", "train.lr=1e-3", "--config", "c.toml",
                                   "--set=precision=bf16", "--set", "a.b=[1, 2]"});
  EXPECT_EQ(cmd.overrides, (std::vector<std::string>{"train.lr=1e-3", "precision=bf16", "a.b=[1, 2]"}));
}

TEST(CliTest, MissingConfigOrValue) {
  const std::string missing = parse_error({"train", "--set", "a=1"});
  EXPECT_TRUE(Contains(missing, "kuafu-gpt train: missing --config PATH"));
  EXPECT_TRUE(Contains(missing, "Run 'kuafu-gpt train --help' for usage."));
  EXPECT_TRUE(Contains(parse_error({"train", "--config"}), "--config"));
  EXPECT_TRUE(Contains(parse_error({"generate", "--config", "c.toml", "--prompt"}), "--prompt"));
  EXPECT_TRUE(Contains(parse_error({"train", "--config", "a.toml", "--config", "b.toml"}), "--config"));
}

TEST(CliTest, UnknownSubcommandListsValidOnes) {
  const std::string message = parse_error({"trian", "--config", "c.toml"});
  EXPECT_TRUE(Contains(message, "unknown subcommand 'trian'; did you mean 'train'?"));
  EXPECT_TRUE(Contains(message, "Subcommands: prepare, train, generate"));
  EXPECT_FALSE(Contains(parse_error({"fly"}), "did you mean"));
  EXPECT_TRUE(
      Contains(parse_error({"--config", "c.toml", "train"}), "expected a subcommand before '--config'"));
}

TEST(CliTest, UnknownOptionOrArgumentIsNamed) {
  EXPECT_TRUE(Contains(parse_error({"generate", "--config", "c.toml", "--promt", "hi"}),
                       "kuafu-gpt generate: unknown option '--promt'; did you mean '--prompt'?"));
  // Options of one subcommand are unknown to the others.
  EXPECT_TRUE(
      Contains(parse_error({"train", "--config", "c.toml", "--prompt", "hi"}), "unknown option '--prompt'"));
  // No prefix guessing.
  EXPECT_TRUE(Contains(parse_error({"train", "--conf", "c.toml"}), "unknown option '--conf'"));
  EXPECT_TRUE(Contains(parse_error({"train", "--config", "c.toml", "stray"}), "unexpected argument 'stray'"));
}

TEST(CliTest, HugeNamesAreEchoedShortly) {
  const std::string huge(10'000'000, 'x');
  const std::string option = "--" + huge;
  for (const std::string& message : {parse_error({huge.c_str()}),
                                     parse_error({"train", "--config", "c.toml", option.c_str()}),
                                     parse_error({"train", "--config", "c.toml", huge.c_str()})}) {
    EXPECT_LT(message.size(), 1000u);
    EXPECT_TRUE(Contains(message, "xxxxxxxxxx"));
    EXPECT_TRUE(Contains(message, "bytes)'"));
  }
}

TEST(CliTest, HelpRequests) {
  const ParsedCommand none = parse({});
  EXPECT_TRUE(none.help);
  EXPECT_EQ(none.subcommand, "");
  const ParsedCommand top = parse({"--help"});
  EXPECT_TRUE(top.help);
  EXPECT_EQ(top.subcommand, "");
  const ParsedCommand sub = parse({"train", "--help"});  // no --config needed for help
  EXPECT_TRUE(sub.help);
  EXPECT_EQ(sub.subcommand, "train");
  EXPECT_TRUE(parse({"generate", "-h"}).help);
  EXPECT_FALSE(parse({"train", "--config", "c.toml"}).help);
}

TEST(CliTest, HelpText) {
  const CommandLine cli = gpt_cli();
  const std::string top = cli.help();
  EXPECT_TRUE(Contains(top, "kuafu-gpt: train and run GPT-style models"));
  EXPECT_TRUE(Contains(top, "  generate   continue a prompt\n"));
  EXPECT_TRUE(Contains(top, "  prepare    tokenize a corpus into token files\n"));

  const std::string gen = cli.help("generate");
  EXPECT_TRUE(Contains(gen, "Usage: kuafu-gpt generate --config PATH"));
  EXPECT_TRUE(Contains(gen, "continue a prompt"));
  EXPECT_TRUE(Contains(gen, "--prompt TEXT"));
  EXPECT_TRUE(Contains(gen, "--max-tokens N (=64)"));
  EXPECT_TRUE(Contains(gen, "--set KEY=VALUE"));
  EXPECT_TRUE(Contains(gen, "--print-config"));
  EXPECT_FALSE(Contains(gen, "--dry-run"));
  EXPECT_FALSE(Contains(gen, "positional"));
  EXPECT_THROW(cli.help("fly"), Error);
}

TEST(CliTest, RejectsBadDeclarations) {
  CommandLine cli("kuafu-gpt", "test");
  cli.subcommand("train", "train");
  EXPECT_THROW(cli.subcommand("train", "again"), Error);
  EXPECT_THROW(cli.option("train", "config", "PATH", "", "clashes with the common --config"), Error);
  EXPECT_THROW(cli.flag("eval", "fast", "undeclared subcommand"), Error);
  EXPECT_THROW(cli.flag("train", "a,b", "boost would read a short name"), Error);
  cli.flag("train", "fast", "ok");
  EXPECT_THROW(cli.option("train", "fast", "X", "", "declared twice"), Error);
}

}  // namespace
}  // namespace kuafu::config
