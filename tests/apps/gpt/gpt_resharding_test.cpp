// Sharded checkpoints move between layouts: a checkpoint written by every rank of one layout (each its
// pieces) is loaded under another and written again at once, and the two hold the same whole tensors,
// bit for bit (weights and optimizer state: loading only moves elements, it computes nothing). Dropout is
// on, so that random streams are part of what is saved; where both layouts have the same ranks each
// rank's random state comes back bit for bit too. Continuing after such a move is compared with the
// serial run in gpt_training_test.cpp (CheckpointMovesBetweenTensorParallelLayouts and others).
#include <gtest/gtest.h>

#include "tests/apps/gpt/gpt_training_support.h"

namespace kuafu::gpt {
namespace {

const std::string kSettings = "model.dropout=0.1\ntrain.steps=3\ndist.timeout_s=60\n";

std::string resume_from(const fs::path& root, const std::string& run) {
  return "train.resume=\"" + train::checkpoint_folder((root / run / "checkpoints").string(), 3) + "\"\n";
}

// Trains 3 steps of `config` in `runtime`, the checkpoint of step 3 written as the layout writes it.
void train_three_steps(const config::Config& config, train::Runtime& runtime) {
  auto task = make_text_task(config, runtime);
  train::Trainer(config, runtime, *task).run();
}

// Loads the step-3 checkpoint `config` resumes from and writes it again, as `runtime`'s layout writes it.
void resave(const config::Config& config, train::Runtime& runtime) {
  auto task = make_text_task(config, runtime);
  train::Trainer trainer(config, runtime, *task);
  ASSERT_EQ(trainer.start_step(), 3);
  trainer.save_checkpoint(3);
}

std::string step3(const fs::path& root, const std::string& run) {
  return train::checkpoint_folder((root / run / "checkpoints").string(), 3);
}

// Every file of `kind` holds the same whole tensors in both checkpoints, bit for bit.
void expect_same_whole_tensors(const std::string& written, const std::string& rewritten) {
  for (const std::string kind : {"model", "optimizer"}) {
    const io::NamedTensors a = train::CheckpointStore::read_whole(written, kind);
    const io::NamedTensors b = train::CheckpointStore::read_whole(rewritten, kind);
    ASSERT_EQ(a.size(), b.size()) << kind;
    std::map<std::string, torch::Tensor> by_name(b.begin(), b.end());
    for (const auto& [name, tensor] : a) {
      ASSERT_TRUE(by_name.count(name)) << kind << " lacks " << name;
      EXPECT_TRUE(torch::equal(tensor, by_name.at(name))) << kind << ": " << name << " differs";
    }
  }
}

// Layouts of the same ranks: each rank's random state went on from where it was saved, bit for bit.
void expect_same_random_states(const std::string& written, const std::string& rewritten, int ranks) {
  for (int rank = 0; rank < ranks; ++rank) {
    const std::string file = "/rng_rank" + std::to_string(rank) + ".safetensors";
    const auto a = io::load_safetensors(written + file), b = io::load_safetensors(rewritten + file);
    EXPECT_TRUE(torch::equal(*a.find("cpu"), *b.find("cpu"))) << file;
  }
}

// How a checkpoint was written: "whole" (one file per kind) or the number of ranks' shard files.
std::string written_as(const std::string& folder) {
  if (fs::exists(fs::path(folder) / "model.safetensors")) return "whole";
  int ranks = 0;
  while (fs::exists(fs::path(folder) / train::shard_file_name("", "model", ranks))) ++ranks;
  return std::to_string(ranks) + " shards";
}

// Trains run `from` (`settings`) on this test's ranks, each writing its pieces (`shards` files); then
// one process (`one` settings) loads its checkpoint and writes it again as one whole file.
void expect_moves_to_one_process(const fs::path& root, const std::string& from, const std::string& settings,
                                 const std::string& shards, const std::string& one) {
  const auto config = make_config(root, from, kSettings + settings);
  train::Runtime runtime = train::start_runtime(config);
  train_three_steps(config, runtime);
  if (!runtime.is_main()) return;
  EXPECT_EQ(written_as(step3(root, from)), shards);
  const auto single_config = make_config(root, from + "_in_one", kSettings + one + resume_from(root, from));
  train::Runtime single = single_runtime();
  resave(single_config, single);
  EXPECT_EQ(written_as(step3(root, from + "_in_one")), "whole");
  expect_same_whole_tensors(step3(root, from), step3(root, from + "_in_one"));
}

TEST_F(GPTTrainingTest, GeminiOnTwoRanksMovesToOnePlainProcessExactly) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 180);
  expect_moves_to_one_process(root_, "gemini2", "memory.strategy=\"gemini\"\ntrain.micro_batch_size=4", "2 shards", "");
}

TEST_F(GPTTrainingTest, TensorTimesDataMovesToTwoDimensionalExactly) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 180);
  const auto first = make_config(root_, "tp1d_dp", kSettings + "parallel.tensor.mode=\"1d\"\nparallel.tensor.size=2\n"
                                                              "train.micro_batch_size=4");
  train::Runtime runtime = train::start_runtime(first);
  train_three_steps(first, runtime);
  const auto second = make_config(root_, "tp2d", kSettings + "parallel.tensor.mode=\"2d\"\nparallel.tensor.size=4\n" +
                                                     resume_from(root_, "tp1d_dp"));
  train::Runtime grid = train::start_runtime(second, runtime.world);
  resave(second, grid);
  if (!runtime.is_main()) return;
  EXPECT_EQ(written_as(step3(root_, "tp2d")), "4 shards");
  expect_same_whole_tensors(step3(root_, "tp1d_dp"), step3(root_, "tp2d"));
  expect_same_random_states(step3(root_, "tp1d_dp"), step3(root_, "tp2d"), 4);
}

TEST_F(GPTTrainingTest, PipelineOfTwoStagesMovesToOneProcessExactly) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 180);
  expect_moves_to_one_process(root_, "pipeline2", "parallel.pipeline=2\nmodel.n_layer=4\ntrain.micro_batch_size=4",
                              "2 shards", "model.n_layer=4\n");
}

TEST_F(GPTTrainingTest, OneProcessMovesToTwoAndAHalfDimensionsExactly) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8, 240);
  const auto spread = make_config(root_, "tp2p5d", kSettings + "parallel.tensor.mode=\"2.5d\"\nparallel.tensor.size=8\n"
                                                               "parallel.tensor.depth=2\n" + resume_from(root_, "one"));
  train::Runtime runtime = train::start_runtime(spread);
  if (runtime.is_main()) {
    train::Runtime single = single_runtime();
    train_three_steps(make_config(root_, "one", kSettings), single);
  }
  dist::barrier(*runtime.world->world_group());  // the checkpoint is complete before any rank reads it
  resave(spread, runtime);
  if (!runtime.is_main()) return;
  EXPECT_EQ(written_as(step3(root_, "tp2p5d")), "8 shards");
  expect_same_whole_tensors(step3(root_, "one"), step3(root_, "tp2p5d"));
}

TEST_F(GPTTrainingTest, ZeroTwoTimesTensorMovesToGeminiExactly) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 180);
  const std::string tensor = "parallel.tensor.mode=\"1d\"\nparallel.tensor.size=2\ntrain.micro_batch_size=4\n";
  const auto zero2 = make_config(root_, "zero2_1d", kSettings + tensor + "memory.strategy=\"zero2\"");
  train::Runtime runtime = train::start_runtime(zero2);
  train_three_steps(zero2, runtime);
  const auto gemini = make_config(root_, "gemini_1d", kSettings + tensor + "memory.strategy=\"gemini\"\n" +
                                                          resume_from(root_, "zero2_1d"));
  resave(gemini, runtime);
  if (!runtime.is_main()) return;
  EXPECT_EQ(written_as(step3(root_, "gemini_1d")), "4 shards");
  expect_same_whole_tensors(step3(root_, "zero2_1d"), step3(root_, "gemini_1d"));
  expect_same_random_states(step3(root_, "zero2_1d"), step3(root_, "gemini_1d"), 4);
}

// Gemini under pipeline 2 x data 2 (each stage's chunks sharded over its data ranks, the tied embedding
// written by the first stage) moves to ZeRO-1 under 1D tensor x data 2.
TEST_F(GPTTrainingTest, GeminiTimesPipelineMovesToZeroOneTimesTensorExactly) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 180);
  const std::string layers = "model.n_layer=4\ntrain.micro_batch_size=2\n";
  const auto staged = make_config(root_, "gemini_pp", kSettings + layers + "parallel.pipeline=2\nmemory.strategy=\"gemini\"");
  train::Runtime runtime = train::start_runtime(staged);
  train_three_steps(staged, runtime);
  const auto tensor = make_config(root_, "zero1_1d", kSettings + layers +
                                                         "parallel.tensor.mode=\"1d\"\nparallel.tensor.size=2\n"
                                                         "memory.strategy=\"zero1\"\n" + resume_from(root_, "gemini_pp"));
  train::Runtime cut = train::start_runtime(tensor, runtime.world);
  resave(tensor, cut);
  if (!runtime.is_main()) return;
  EXPECT_EQ(written_as(step3(root_, "gemini_pp")), "4 shards");
  expect_same_whole_tensors(step3(root_, "gemini_pp"), step3(root_, "zero1_1d"));
}

}  // namespace
}  // namespace kuafu::gpt
