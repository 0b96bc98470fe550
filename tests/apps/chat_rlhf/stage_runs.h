// What the kuafu-chat pipeline tests share: the tiny task's data (a byte-per-token tokenizer,
// tests/support/byte_tokenizer.h), the configs of its stages, and running a stage through the command
// line a user runs.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/byte_tokenizer.h"
#include "tests/support/run_command.h"

namespace kuafu::chat {
namespace fs = std::filesystem;

inline const char* const kAnswers[] = {"a bird", "a small stone", "to run fast", "very old", "a kind of tree"};

inline std::string answer(int n) { return std::string(kAnswers[n % 5]) + " of " + std::to_string(n % 7) + "."; }

// The tokenizer (<root>/tokenizer, with `specials`), instructions (train.jsonl, val.jsonl) and preference
// pairs (train_pairs.jsonl, val_pairs.jsonl) of the tiny task.
inline void write_data(const fs::path& root, testing::SpecialTokens specials = testing::SpecialTokens::kOpt) {
  testing::write_byte_tokenizer(root / "tokenizer", specials);
  for (const auto& [name, first, count] : std::vector<std::tuple<std::string, int, int>>{{"train", 0, 40}, {"val", 100, 8}}) {
    std::ofstream instructions(root / (name + ".jsonl")), pairs(root / (name + "_pairs.jsonl"));
    for (int n = first; n < first + count; ++n) {
      const std::string prompt = "What does w" + std::to_string(n) + " mean?";
      instructions << nlohmann::json{{"prompt", prompt}, {"response", answer(n)}}.dump() << "\n";
      const bool other = n % 2 == 0;
      const std::string rejected = other ? answer(n + 1) : "a a a a a a a a.";
      pairs << nlohmann::json{{"prompt", prompt}, {"chosen", answer(n)}, {"rejected", rejected}, {"kind", other ? "other" : "loop"}}.dump()
            << "\n";
    }
  }
}

// `data`: the stage's data.* lines besides the tokenizer and context; `tokenizer`: the tokenizer folder
// (empty: write_data's).
inline std::string common_config(const fs::path& root, const std::string& out, int steps, const std::string& data,
                                 const fs::path& tokenizer = {}) {
  return "[data]\ntokenizer = \"" + (tokenizer.empty() ? root / "tokenizer" : tokenizer).string() + "\"\ncontext = 64\n" + data +
         "[train]\nsteps = " + std::to_string(steps) + "\nbatch_size = 8\nmicro_batch_size = 4\neval_rows = 8\n"
         "progress = \"plain\"\nlog_interval = 100\ncheckpoint_interval = 1000\nout_dir = \"" + (root / out).string() + "\"\n"
         "[runtime]\nthreads = 1\ndevice = \"cpu\"\n";
}

inline fs::path write_config(const fs::path& root, const std::string& name, const std::string& text) {
  const fs::path path = root / (name + ".toml");
  std::ofstream(path) << text;
  return path;
}

inline std::vector<nlohmann::json> metrics(const fs::path& run) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss")) lines.push_back(j);
  }
  return lines;
}

inline testing::CommandResult chat(const std::string& args) { return testing::run_command(std::string(KUAFU_CHAT_PATH) + " " + args); }

// Trains `stage` with the config `text` (written as <root>/<name>.toml, the run in <root>/<name>_run) and
// `args` (e.g. --set ...) and returns the run's training lines of metrics.jsonl; a failed run fails the
// test with its output.
// `ranks` > 1: as that many processes on this machine (kuafu-run).
inline std::vector<nlohmann::json> train_stage(const fs::path& root, const std::string& stage, const std::string& name,
                                               const std::string& text, const std::string& args = "", int ranks = 1) {
  const fs::path config = write_config(root, name, text);
  const std::string command = stage + " --config " + config.string() + " " + args;
  const testing::CommandResult trained =
      ranks == 1 ? chat(command)
                 : testing::run_command(std::string(KUAFU_RUN_PATH) + " --nproc-per-node " + std::to_string(ranks) +
                                        " --master-port 0 " + KUAFU_CHAT_PATH + " " + command);
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  return metrics(root / (name + "_run"));
}

// Each of two runs' steps has the other's loss and gradient norm, to `relative` (of at least 1).
inline void expect_same_steps(const std::vector<nlohmann::json>& actual, const std::vector<nlohmann::json>& expected,
                              double relative, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t step = 0; step < expected.size(); ++step) {
    for (const char* key : {"loss", "grad_norm"}) {
      const double want = expected[step][key].get<double>();
      EXPECT_NEAR(actual[step][key].get<double>(), want, relative * std::max(1.0, std::abs(want)))
          << what << " " << key << " step " << step + 1;
    }
  }
}

// A PPO or GRPO config from <root>/sft_hf (actor and reference) and <root>/rm_hf (reward); `rl`: its
// rl.* lines besides the reward model and the held-out prompts.
// `reward_model`: the folder under `root` (empty: none, rewards a program checks alone).
inline std::string rl_config(const fs::path& root, const std::string& out, int steps, const std::string& rl,
                             const std::string& reward_model = "rm_hf") {
  return common_config(root, out, steps, "train = \"" + (root / "train.jsonl").string() + "\"\n") +
         "[model]\ninit_from = \"" + (root / "sft_hf").string() + "\"\n"
         "[optim]\nlr = 1e-4\nwarmup_steps = 0\n[generate]\nmax_new_tokens = 12\ntemperature = 1.0\n"
         "[rl]\n" + (reward_model.empty() ? "" : "reward_model = \"" + (root / reward_model).string() + "\"\n") +
         "eval_prompts = \"" + (root / "val.jsonl").string() + "\"\neval_prompts_count = 4\n" + rl;
}

}  // namespace kuafu::chat
