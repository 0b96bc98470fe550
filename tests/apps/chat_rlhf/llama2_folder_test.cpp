// A Llama 2 folder as Meta publishes one, tiny (tests/python/rlhf_models_reference.py llama2_start): a
// SentencePiece tokenizer.model and no tokenizer.json, tokenizer_config.json naming LlamaTokenizer with an
// [INST] chat template, a LlamaForCausalLM over the model's pieces. SFT trains from it (its data framed by
// that template, tokenized as transformers' LlamaTokenizer tokenizes); the export carries tokenizer.model,
// and `chat` answers a held-out prompt with transformers' greedy answer from the exported folder (its
// AutoTokenizer's template and ids, generate, decode), character for character: the tokenizer, the
// template, generation and decoding all agree end to end.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/util/atomic_file.h"
#include "tests/apps/chat_rlhf/stage_runs.h"
#include "tests/support/json_lines.h"
#include "tests/support/python_reference.h"
#include "tests/support/test_util.h"

namespace kuafu::chat {
namespace {

TEST(Llama2FolderTest, SftExportAndChatReadTheSentencePieceModelAsTransformersDoes) {
  const fs::path root = testing::temp_dir("chat_llama2_folder");
  write_data(root);
  const fs::path start = root / "llama2";
  const testing::PythonRun made = testing::run_python_reference(
      "rlhf_models_reference.py", "llama2_start " + start.string() + " " + (root / "train.jsonl").string());
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ASSERT_FALSE(fs::exists(start / "tokenizer.json"));
  const std::vector<nlohmann::json> trained = train_stage(root, "sft", "sft",
      common_config(root, "sft_run", 30, "train = \"" + (root / "train.jsonl").string() + "\"\nval = \"" + (root / "val.jsonl").string() + "\"\n",
                    start) +
      "[model]\ninit_from = \"" + start.string() + "\"\n[optim]\nlr = 3e-3\nwarmup_steps = 2\n");
  ASSERT_EQ(trained.size(), 30u);
  EXPECT_LT(trained.back()["loss"].get<double>(), 0.75 * trained.front()["loss"].get<double>()) << "SFT learns the task";
  const fs::path exported = root / "llama2_hf";
  const testing::CommandResult written = chat("sft export --config " + (root / "sft.toml").string() + " --out " + exported.string());
  ASSERT_EQ(written.exit_code, 0) << written.output;
  EXPECT_TRUE(fs::exists(exported / "tokenizer.model"));
  EXPECT_FALSE(fs::exists(exported / "tokenizer.json"));

  const std::string prompt = "What does w103 mean?";  // a held-out prompt (val.jsonl)
  const testing::CommandResult answered =
      chat("chat --model " + exported.string() + " --prompt '" + prompt + "' --max-new-tokens 12 2> " + (root / "chat.err").string());
  ASSERT_EQ(answered.exit_code, 0) << answered.output << read_file((root / "chat.err").string());
  const testing::PythonRun reference = testing::run_python_reference(
      "rlhf_models_reference.py", "llama2_answer " + exported.string() + " '" + prompt + "' 12");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const nlohmann::json expected = testing::last_json_line(reference.output);
  EXPECT_EQ(expected["files"], nlohmann::json({"tokenizer.model", "tokenizer_config.json"}));
  ASSERT_FALSE(expected["answer"].get<std::string>().empty());
  EXPECT_EQ(answered.output, expected["answer"].get<std::string>() + "\n") << expected.dump();
}

}  // namespace
}  // namespace kuafu::chat
