// The kuafu-chat stages end to end through the command line a user runs, on a tiny task with the
// byte-per-token tokenizer (tests/support/byte_tokenizer.h): SFT from scratch, the reward model from the
// SFT folder, DPO, PPO and GRPO from both, each exported as a Hugging Face folder. What each stage must
// show at its first step is checked exactly: DPO's loss is log 2 (the policy is its reference), PPO's
// first mini-batch has ratio 1, no clipping and no approximate KL, GRPO's loss with β = 0 is 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <unistd.h>

#include "apps/chat_rlhf/chat_session.h"
#include "apps/chat_rlhf/rl_stage.h"
#include "apps/chat_rlhf/scored_model.h"
#include "apps/opt_finetune/causal_lm_family.h"
#include "apps/opt_finetune/hugging_face.h"
#include "core/io/hf_folder.h"
#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "core/train/model_memory.h"
#include "core/train/runtime.h"
#include "core/util/atomic_file.h"
#include "tests/apps/chat_rlhf/stage_runs.h"
#include "tests/support/python_reference.h"
#include "tests/support/run_command.h"
#include "tests/support/multiprocess.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu::chat {
namespace {
namespace fs = std::filesystem;

class ChatPipelineTest : public ::testing::Test {
 protected:
  // One pipeline for the suite: SFT and the reward model, which the later stages start from.
  static void SetUpTestSuite() {
    // The same folder in the worker processes of a multi-rank test, which find the parent's models there.
    root_ = testing::shared_test_dir("chat_pipeline");
    if (testing::is_worker()) return;
    fs::remove_all(root_);
    write_data(root_);
    const fs::path sft = write_config(root_, "sft", common_config(root_, "sft_run", 40,
        "train = \"" + (root_ / "train.jsonl").string() + "\"\nval = \"" + (root_ / "val.jsonl").string() + "\"\n") +
        "[model]\nhidden_size = 32\nnum_hidden_layers = 2\nnum_attention_heads = 2\nffn_dim = 64\n"
        "max_position_embeddings = 64\ndropout = 0.0\n"
        "[optim]\nlr = 3e-3\nwarmup_steps = 2\n");
    sft_trained_ = chat("sft --config " + sft.string());
    sft_exported_ = chat("sft export --config " + sft.string() + " --out " + (root_ / "sft_hf").string());
    const fs::path rm = write_config(root_, "rm", common_config(root_, "rm_run", 20, "train = \"" + (root_ / "train_pairs.jsonl").string() + "\"\nval = \"" + (root_ / "val_pairs.jsonl").string() + "\"\n") +
        "[model]\ninit_from = \"" + (root_ / "sft_hf").string() + "\"\n"
        "[optim]\nlr = 2e-3\nwarmup_steps = 2\n");
    rm_trained_ = chat("rm --config " + rm.string());
    rm_eval_ = chat("rm eval --config " + rm.string());
    rm_exported_ = chat("rm export --config " + rm.string() + " --out " + (root_ / "rm_hf").string());
  }
  // The metrics of 2 DPO steps from the SFT folder, `extra` (config sections) appended: <root>/<name>_run.
  static std::vector<nlohmann::json> dpo_steps(const std::string& name, const std::string& extra) {
    return train_stage(root_, "dpo", name, common_config(root_, name + "_run", 2,
        "train = \"" + (root_ / "train_pairs.jsonl").string() + "\"\nval = \"" + (root_ / "val_pairs.jsonl").string() + "\"\n") +
        "[model]\ninit_from = \"" + (root_ / "sft_hf").string() + "\"\n[optim]\nlr = 1e-3\nwarmup_steps = 1\n" + extra);
  }
  static fs::path root_;
  static testing::CommandResult sft_trained_, sft_exported_, rm_trained_, rm_eval_, rm_exported_;
};
fs::path ChatPipelineTest::root_;
testing::CommandResult ChatPipelineTest::sft_trained_, ChatPipelineTest::sft_exported_, ChatPipelineTest::rm_trained_,
    ChatPipelineTest::rm_eval_, ChatPipelineTest::rm_exported_;

TEST_F(ChatPipelineTest, SftAndRewardModelTrainAndExport) {
  ASSERT_EQ(sft_trained_.exit_code, 0) << sft_trained_.output;
  ASSERT_EQ(sft_exported_.exit_code, 0) << sft_exported_.output;
  ASSERT_EQ(rm_trained_.exit_code, 0) << rm_trained_.output;
  ASSERT_EQ(rm_eval_.exit_code, 0) << rm_eval_.output;
  const nlohmann::json eval = testing::last_json_line(rm_eval_.output);
  for (const char* key : {"val_accuracy", "val_margin", "val_accuracy_other", "val_accuracy_loop", "val_loss"}) {
    EXPECT_TRUE(eval.contains(key)) << key << " in " << eval.dump();
  }
  EXPECT_EQ(eval["pairs"], 8);
  // It learned: on the 8 held-out pairs, better than its starting weights (a random score head) and than
  // chance, and every "loop" pair (an answer against a repeated token) ranked right.
  const testing::CommandResult start = chat("rm eval --config " + (root_ / "rm.toml").string() + " --checkpoint init");
  ASSERT_EQ(start.exit_code, 0) << start.output;
  const nlohmann::json before = testing::last_json_line(start.output);
  EXPECT_LT(eval["val_loss"].get<double>(), before["val_loss"].get<double>()) << before.dump() << " then " << eval.dump();
  EXPECT_LT(eval["val_loss"].get<double>(), std::log(2.0));
  EXPECT_GT(eval["val_accuracy"].get<double>(), 0.5);
  EXPECT_EQ(eval["val_accuracy_loop"].get<double>(), 1.0);
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  const nlohmann::json config = nlohmann::json::parse(read_file((root_ / "rm_hf/config.json").string()));
  EXPECT_EQ(config["architectures"][0], "OPTForSequenceClassification");
  ScoredModel exported = load_scored_model((root_ / "rm_hf").string());
  EXPECT_TRUE(fs::exists(root_ / "rm_hf/vocab.json")) << "the tokenizer travels with the folder";
}

TEST_F(ChatPipelineTest, DpoStartsAtLogTwoAndRaisesPreferenceAccuracy) {
  ASSERT_EQ(sft_exported_.exit_code, 0) << sft_exported_.output;
  const std::vector<nlohmann::json> lines = train_stage(root_, "dpo", "dpo", common_config(root_, "dpo_run", 6,
      "train = \"" + (root_ / "train_pairs.jsonl").string() + "\"\nval = \"" + (root_ / "val_pairs.jsonl").string() + "\"\n") +
      "[model]\ninit_from = \"" + (root_ / "sft_hf").string() + "\"\n"
      "[optim]\nlr = 1e-3\nwarmup_steps = 1\n[dpo]\nbeta = 0.1\n");
  ASSERT_EQ(lines.size(), 6u);
  // The policy is its reference at step 1: h = 0 for every pair, −log σ(0) = log 2.
  EXPECT_NEAR(lines[0]["loss"].get<double>(), std::log(2.0), 1e-5);
  // Held out: the starting weights rank no pair (h = 0 everywhere); six steps rank most right.
  const std::string dpo = (root_ / "dpo.toml").string();
  const testing::CommandResult before = chat("dpo eval --config " + dpo + " --checkpoint init"), after = chat("dpo eval --config " + dpo);
  ASSERT_EQ(before.exit_code, 0) << before.output;
  ASSERT_EQ(after.exit_code, 0) << after.output;
  EXPECT_EQ(testing::last_json_line(before.output)["val_accuracy"].get<double>(), 0.0) << before.output;
  EXPECT_GT(testing::last_json_line(after.output)["val_accuracy"].get<double>(), 0.5) << after.output;
  EXPECT_LT(testing::last_json_line(after.output)["val_loss"].get<double>(), std::log(2.0)) << after.output;
}

// DPO trains its policy with dropout off (trl's disable_dropout): from a folder fine-tuned with dropout 0.1
// the first step's loss is still exactly log 2 (the policy is its reference); with dpo.disable_dropout =
// false the masked forward is not its reference's, and the loss moves off log 2.
TEST_F(ChatPipelineTest, DpoTrainsWithoutTheFoldersDropout) {
  ASSERT_EQ(sft_exported_.exit_code, 0) << sft_exported_.output;
  const auto first_loss = [&](const std::string& name, const std::string& dpo) {
    const std::vector<nlohmann::json> lines = train_stage(root_, "dpo", name, common_config(root_, name + "_run", 1,
        "train = \"" + (root_ / "train_pairs.jsonl").string() + "\"\nval = \"" + (root_ / "val_pairs.jsonl").string() + "\"\n") +
        "[model]\ninit_from = \"" + (root_ / "sft_hf").string() + "\"\ndropout = 0.1\n"
        "[optim]\nlr = 1e-3\nwarmup_steps = 1\n[dpo]\nbeta = 0.1\n" + dpo);
    return lines.empty() ? -1.0 : lines[0]["loss"].get<double>();
  };
  EXPECT_NEAR(first_loss("dpo_no_dropout", ""), std::log(2.0), 1e-5);
  EXPECT_GT(std::abs(first_loss("dpo_dropout", "disable_dropout = false\n") - std::log(2.0)), 1e-3);
}

// Under ZeRO-2 and Gemini DPO's policy is left described (lazy construction) and its strategy fills
// its chunks from train.seed and the SFT folder: each of the first two steps has the plain run's loss
// and gradient norm (float32, the same sums in chunk order: 1e-5 relative). Evaluating such a config
// makes the policy whole: at its starting weights every pair's loss is log 2.
TEST_F(ChatPipelineTest, DpoPolicyLeftDescribedTakesThePlainSteps) {
  ASSERT_EQ(sft_exported_.exit_code, 0) << sft_exported_.output;
  auto dpo = [&](const std::string& strategy) { return dpo_steps("dpo_" + strategy, "[memory]\nstrategy = \"" + strategy + "\"\n"); };
  const std::vector<nlohmann::json> plain = dpo("none");
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_GT(plain[1]["grad_norm"].get<double>(), 0.0);
  for (const std::string strategy : {"zero2", "gemini"}) expect_same_steps(dpo(strategy), plain, 1e-5, strategy);
  const testing::CommandResult eval = chat("dpo eval --checkpoint init --config " + (root_ / "dpo_gemini.toml").string());
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NEAR(testing::last_json_line(eval.output)["val_loss"].get<double>(), std::log(2.0), 1e-5) << eval.output;
}

// DPO's reference is a frozen model of its own section ([models.reference], once refused as unknown):
// offloaded to host memory it gives the plain run's steps (float32 both: 1e-6); in bf16 its log-probs
// are rounded, so the first loss leaves log 2 by the rounding alone (under 1e-2).
TEST_F(ChatPipelineTest, DpoReferenceIsAFrozenModelOfItsOwnSection) {
  ASSERT_EQ(sft_exported_.exit_code, 0) << sft_exported_.output;
  const std::vector<nlohmann::json> plain = dpo_steps("dpo_ref_plain", "");
  const std::vector<nlohmann::json> rounded = dpo_steps("dpo_ref_bf16", "[models.reference.precision]\ndtype = \"bf16\"\n");
  ASSERT_EQ(plain.size(), 2u);
  ASSERT_EQ(rounded.size(), 2u);
  expect_same_steps(dpo_steps("dpo_ref_offloaded", "[models.reference.memory]\noffload_frozen = true\n"), plain, 1e-6, "offloaded");
  const double first = rounded[0]["loss"].get<double>();
  EXPECT_NE(first, plain[0]["loss"].get<double>());
  EXPECT_NEAR(first, std::log(2.0), 1e-2);
}

TEST_F(ChatPipelineTest, PpoFirstMiniBatchIsOnPolicyAndEveryFigureIsLogged) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  // A rollout of 16 prompts, 2 epochs x 2 mini-batches of 8: 4 optimizer steps per rollout.
  const std::vector<nlohmann::json> lines = train_stage(root_, "ppo", "ppo", rl_config(root_, "ppo_run", 4,
      "prompts_per_rollout = 16\nepochs = 2\nmini_batches = 2\nmissing_eos_penalty = -1.0\nentropy_coef = 0.01\n"));
  ASSERT_EQ(lines.size(), 4u);
  const fs::path ppo = root_ / "ppo.toml";
  for (const char* key : {"reward", "kl", "response_length", "eos_rate", "answer_f1", "clip_fraction", "approx_kl", "ratio",
                          "actor.loss", "critic.loss", "kl_coef"}) {
    EXPECT_TRUE(lines[0].contains(key)) << key << " in " << lines[0].dump();
  }
  // The first mini-batch is scored by the weights that sampled it, dropout off: ratio 1 up to float32
  // rounding of the same forward on fewer rows.
  EXPECT_NEAR(lines[0]["ratio"].get<double>(), 1.0, 1e-5);
  EXPECT_EQ(lines[0]["clip_fraction"].get<double>(), 0.0);
  EXPECT_LT(lines[0]["approx_kl"].get<double>(), 1e-10);
  EXPECT_LT(lines[0]["kl"].get<double>(), 1e-4) << "the actor starts as its reference";
  const testing::CommandResult eval = chat("ppo eval --config " + ppo.string());
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  const nlohmann::json e = testing::last_json_line(eval.output);
  for (const char* key : {"val_reward", "val_kl", "val_length", "val_eos_rate", "val_answer_f1"}) EXPECT_TRUE(e.contains(key)) << key;
  const testing::CommandResult exported = chat("ppo export --config " + ppo.string() + " --out " + (root_ / "ppo_hf").string());
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  opt::OPTForCausalLM actor = opt::opt_format().load((root_ / "ppo_hf").string());
  EXPECT_GT(actor->config.num_hidden_layers, 0);
}

// The on-policy checks with the two things a dropout-free, temperature-1 fixture cannot see: the actor at
// dropout 0.1 sampling at temperature 0.7. PPO's first mini-batch still has ratio 1 and no approximate KL
// (the update scores the sampled tokens in eval mode at the sampling temperature), and the actor starts as
// its reference (KL ~ 0: both read at that temperature); GRPO's first step (its own log-probabilities) has
// the reference's too. A policy left in training mode or scored at temperature 1 fails each.
TEST_F(ChatPipelineTest, FirstStepsAreOnPolicyWithDropoutAndATemperature) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  const std::string args = "--set model.dropout=0.1 --set generate.temperature=0.7";
  const std::vector<nlohmann::json> ppo = train_stage(root_, "ppo", "ppo_dropout", rl_config(root_, "ppo_dropout_run", 1,
      "prompts_per_rollout = 8\nepochs = 1\nmini_batches = 1\n"), args);
  ASSERT_EQ(ppo.size(), 1u);
  EXPECT_NEAR(ppo[0]["ratio"].get<double>(), 1.0, 1e-5);
  EXPECT_LT(ppo[0]["approx_kl"].get<double>(), 1e-10);
  EXPECT_LT(ppo[0]["kl"].get<double>(), 1e-4) << "the actor starts as its reference";
  const std::vector<nlohmann::json> grpo = train_stage(root_, "grpo", "grpo_dropout", rl_config(root_, "grpo_dropout_run", 1,
      "prompts_per_rollout = 2\ngroup_size = 4\nkl_coef = 0.04\nepochs = 1\nmini_batches = 1\n"), args);
  ASSERT_EQ(grpo.size(), 1u);
  EXPECT_LT(std::abs(grpo[0]["kl"].get<double>()), 1e-4) << grpo[0].dump();
}

// rl.critic_warmup_rollouts: the first rollout's step trains the critic alone (the actor's gradient norm 0,
// no ratio figures, its weights in the checkpoint the SFT folder's to the bit); the next rollout's first
// step trains both, the actor on-policy (ratio 1).
TEST_F(ChatPipelineTest, PpoWarmsTheCriticUpBeforeTheActorLearns) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  const std::vector<nlohmann::json> lines = train_stage(root_, "ppo", "ppo_warmup", rl_config(root_, "ppo_warmup_run", 2,
      "prompts_per_rollout = 8\nepochs = 1\nmini_batches = 1\ncritic_warmup_rollouts = 1\n"), "--set train.checkpoint_interval=1");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["actor.grad_norm"].get<double>(), 0.0);
  EXPECT_FALSE(lines[0].contains("ratio")) << lines[0].dump();
  EXPECT_GT(lines[0]["critic.grad_norm"].get<double>(), 0.0);
  EXPECT_GT(lines[1]["actor.grad_norm"].get<double>(), 0.0);
  EXPECT_NEAR(lines[1]["ratio"].get<double>(), 1.0, 1e-5);
  const io::SafetensorsFile sft = io::load_safetensors((root_ / "sft_hf" / "model.safetensors").string());
  const fs::path step1 = train::checkpoint_folder((root_ / "ppo_warmup_run" / "checkpoints").string(), 1);
  int compared = 0;
  for (const auto& entry : fs::directory_iterator(step1)) {
    if (entry.path().filename().string().rfind("actor", 0) != 0 || entry.path().extension() != ".safetensors") continue;
    for (const auto& [name, tensor] : io::load_safetensors(entry.path().string()).tensors) {
      const torch::Tensor* start = sft.find(name);
      if (!start) continue;
      EXPECT_TRUE(torch::equal(tensor, *start)) << name;
      ++compared;
    }
  }
  EXPECT_EQ(compared, static_cast<int>(sft.tensors.size())) << "every weight of the actor in " << step1;
  const testing::CommandResult refused = chat("ppo --config " + (root_ / "ppo_warmup.toml").string() +
                                              " --set rl.shared_trunk=true --set train.out_dir=" + (root_ / "ppo_warmup_shared").string());
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("rl.critic_warmup_rollouts"), std::string::npos) << refused.output;
}

// The trap of sharded actors: under Gemini every forward gathers chunks from both ranks, so a rank whose
// sampled rows have all stopped must keep decoding until the other's have (nn::all_done_over). Two
// ranks, each sampling its own prompts at temperature 1, train two steps and evaluate.
TEST_F(ChatPipelineTest, PpoWithAGeminiActorOnTwoRanksNeverHangs) {
  if (!testing::is_worker()) {
    ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
    testing::run_test_on_ranks(2, 300);
    const std::vector<nlohmann::json> lines = metrics(root_ / "ppo_gemini_run");
    ASSERT_EQ(lines.size(), 2u);
    for (const nlohmann::json& line : lines) EXPECT_TRUE(std::isfinite(line["loss"].get<double>())) << line.dump();
    EXPECT_EQ(lines[0]["actor.grad_norm"].get<double>(), 0.0) << "the critic's warm-up rollout";
    EXPECT_GT(lines[1]["actor.grad_norm"].get<double>(), 0.0);
    return;
  }
  // The first rollout warms the critic up: the Gemini actor sits its step out on both ranks alike.
  const config::Config config = config::Config::from_string(
      rl_config(root_, "ppo_gemini_run", 2, "prompts_per_rollout = 8\ncritic_warmup_rollouts = 1\n") +
          "[models.actor.memory]\nstrategy = \"gemini\"\n",
      "ppo_gemini.toml", stage_schema(Stage::Ppo));
  train::Runtime runtime = train::start_runtime(config, testing::worker_world());
  const std::unique_ptr<train::App> app = make_rl_app(config, Stage::Ppo);
  const std::unique_ptr<train::RunTask> task = app->make_task(runtime.model_options(), &runtime);
  train::Trainer trainer(config, runtime, *task);
  EXPECT_EQ(trainer.run().steps_done, 2);
}

// Accumulating micro-batches of different lengths gives the step of the whole mini-batch at once: the
// losses are normalised by the mini-batch's token count, not each micro-batch's. One rollout of 8
// prompts, one step, as 1 micro-batch of 8 and as 4 of 2: the same losses and gradient norms (float32
// sums in another order: 1e-5 relative).
TEST_F(ChatPipelineTest, PpoStepIsTheSameAccumulatedOrWhole) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  std::vector<nlohmann::json> first;
  for (const int micro : {8, 2}) {
    const std::string name = "ppo_micro" + std::to_string(micro);
    const std::vector<nlohmann::json> lines = train_stage(root_, "ppo", name, rl_config(root_, name + "_run", 1,
        "prompts_per_rollout = 8\n"), "--set train.micro_batch_size=" + std::to_string(micro));
    ASSERT_EQ(lines.size(), 1u);
    first.push_back(lines[0]);
  }
  for (const char* key : {"actor.loss", "critic.loss", "actor.grad_norm", "critic.grad_norm", "reward", "response_length"}) {
    const double whole = first[0][key].get<double>(), accumulated = first[1][key].get<double>();
    EXPECT_NEAR(accumulated, whole, 1e-5 * std::max(1.0, std::abs(whole))) << key;
  }
}

// rl.clip_high reaches the policy loss (DAPO's clip-higher): after a large first step the second epoch's
// ratios leave [0.8, 1.2] on both sides; with the upper bound at 1 + 10 only the lower side clips, so
// fewer tokens do, from the same first step.
TEST_F(ChatPipelineTest, PpoClipsTheRatioAboveAtClipHigh) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  std::vector<std::vector<nlohmann::json>> runs;
  for (const std::string& high : {std::string(""), std::string("clip_high = 10.0\n")}) {
    const std::string name = high.empty() ? "ppo_clip_symmetric" : "ppo_clip_high";
    runs.push_back(train_stage(root_, "ppo", name, rl_config(root_, name + "_run", 2,
        "prompts_per_rollout = 8\nepochs = 2\nmini_batches = 1\n" + high), "--set optim.lr=0.05"));
    ASSERT_EQ(runs.back().size(), 2u);
  }
  EXPECT_NEAR(runs[1][0]["actor.loss"].get<double>(), runs[0][0]["actor.loss"].get<double>(), 1e-6) << "the same first step";
  const double symmetric = runs[0][1]["clip_fraction"].get<double>(), upper_open = runs[1][1]["clip_fraction"].get<double>();
  EXPECT_GT(symmetric, 0.0);
  EXPECT_LT(upper_open, symmetric);
}

// A response cut at generate.max_new_tokens ends its episode by default: the rollout a checkpoint keeps has
// no value bootstrapped past any cut (3 new tokens: the answers are longer, so most are cut); with
// rl.bootstrap_truncated the cut ones carry the critic's value after their last token.
TEST_F(ChatPipelineTest, PpoEndsTheEpisodeOfACutResponse) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  const auto rollout = [&](const std::string& name, const std::string& rl) {
    train_stage(root_, "ppo", name, rl_config(root_, name + "_run", 1, "prompts_per_rollout = 8\nepochs = 2\nmini_batches = 1\n" + rl),
                "--set generate.max_new_tokens=3 --set train.checkpoint_interval=1");
    return io::load_safetensors(fs::path(train::checkpoint_folder((root_ / (name + "_run") / "checkpoints").string(), 1)) /
                                "task_rank0.safetensors");
  };
  for (const bool bootstrap : {false, true}) {
    const io::SafetensorsFile state = rollout(bootstrap ? "ppo_cut_bootstrapped" : "ppo_cut", bootstrap ? "bootstrap_truncated = true\n" : "");
    const torch::Tensor* values = state.find("experience.bootstrap");
    const torch::Tensor* ended = state.find("experience.ended");
    ASSERT_TRUE(values && ended) << "the checkpoint keeps its rollout";
    const torch::Tensor cut = ended->to(torch::kBool).logical_not();
    ASSERT_GT(cut.sum().item<int64_t>(), 0) << "some responses are cut";
    EXPECT_EQ(values->masked_select(ended->to(torch::kBool)).abs().sum().item<double>(), 0.0) << "an ended one never bootstraps";
    if (bootstrap) {
      EXPECT_GT(values->masked_select(cut).abs().min().item<double>(), 0.0);
    } else {
      EXPECT_EQ(values->abs().sum().item<double>(), 0.0);
    }
  }
}

// Each of the four PPO models takes its own memory strategy: actor and critic under Gemini (their
// chunks gathered around each part, the critic's score head in its tail part), reference and reward
// offloaded to the host a block at a time. The first step equals the plain run's: the same rollout,
// losses and gradient norms (float32, the same sums in chunk order: 1e-5 relative). The reward model
// trains under Gemini too, with the plain run's first step.
TEST_F(ChatPipelineTest, EveryModelTakesItsOwnMemoryStrategy) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  const std::string strategies =
      "[models.actor.memory]\nstrategy = \"gemini\"\n[models.critic.memory]\nstrategy = \"gemini\"\n"
      "[models.reference.memory]\noffload_frozen = true\n[models.reward.memory]\noffload_frozen = true\n";
  std::vector<nlohmann::json> first;
  for (const std::string& extra : {std::string(), strategies}) {
    const std::string name = extra.empty() ? "ppo_plain" : "ppo_strategies";
    const std::vector<nlohmann::json> lines =
        train_stage(root_, "ppo", name, rl_config(root_, name + "_run", 1, "prompts_per_rollout = 8\n") + extra);
    ASSERT_EQ(lines.size(), 1u);
    first.push_back(lines[0]);
  }
  for (const char* key : {"reward", "kl", "response_length", "actor.loss", "critic.loss", "actor.grad_norm", "critic.grad_norm"}) {
    const double plain = first[0][key].get<double>(), strategies_run = first[1][key].get<double>();
    EXPECT_NEAR(strategies_run, plain, 1e-5 * std::max(1.0, std::abs(plain))) << key;
  }
  std::vector<nlohmann::json> rm_first;
  for (const std::string strategy : {"none", "gemini"}) {
    const fs::path out = root_ / ("rm_" + strategy + "_run");
    const testing::CommandResult trained = chat("rm --config " + (root_ / "rm.toml").string() + " --set train.steps=1 --set train.out_dir='\"" +
                                                out.string() + "\"' --set memory.strategy='\"" + strategy + "\"'");
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const std::vector<nlohmann::json> lines = metrics(out);
    ASSERT_EQ(lines.size(), 1u);
    rm_first.push_back(lines[0]);
  }
  for (const char* key : {"loss", "grad_norm"}) {
    const double plain = rm_first[0][key].get<double>(), gemini = rm_first[1][key].get<double>();
    EXPECT_NEAR(gemini, plain, 1e-5 * std::max(1.0, std::abs(plain))) << key;
  }
  // Its benchmark leaves the model described for Gemini to fill too (a model on the meta device that
  // nothing fills is refused).
  const testing::CommandResult benchmark = chat("rm benchmark --config " + (root_ / "rm.toml").string() +
                                                " --set memory.strategy='\"gemini\"' --set benchmark.steps=1 --set benchmark.warmup=0");
  ASSERT_EQ(benchmark.exit_code, 0) << benchmark.output;
  EXPECT_GT(testing::last_json_line(benchmark.output)["step_time_ms_median"].get<double>(), 0.0) << benchmark.output;
}

// rl.shared_trunk: the critic is a value head on the actor's decoder, one model trained on the policy
// loss plus rl.value_coef x the value loss. Against separate models starting alike (the critic from the
// SFT folder, both value heads fresh at zero), the first step has the same rollout and values, the
// shared model's loss is the actor's plus the critic's, and its squared gradient norm their sum (the
// zero head passes no value gradient into the trunk yet; float32: 1e-5 relative); under ZeRO-2 and under
// Gemini (one pass of the trunk for both losses, its chunks gathered around each part of it) its step is
// the same. The shared run evaluates and exports the actor alone.
TEST_F(ChatPipelineTest, SharedTrunkLearnsFromBothLosses) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  const std::string rl = "prompts_per_rollout = 8\n";
  const std::vector<nlohmann::json> separate = train_stage(root_, "ppo", "ppo_separate", rl_config(root_, "ppo_separate_run", 1,
      rl + "critic_init = \"" + (root_ / "sft_hf").string() + "\"\n"));
  const std::vector<nlohmann::json> shared = train_stage(root_, "ppo", "ppo_shared", rl_config(root_, "ppo_shared_run", 1,
      rl + "shared_trunk = true\n"));
  ASSERT_EQ(separate.size(), 1u);
  ASSERT_EQ(shared.size(), 1u);
  const nlohmann::json& a = separate[0];
  const nlohmann::json& b = shared[0];
  auto near = [](double got, double want, const char* what) {
    EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want))) << what;
  };
  for (const char* key : {"reward", "kl", "response_length", "value_loss"}) near(b[key].get<double>(), a[key].get<double>(), key);
  EXPECT_FALSE(b.contains("critic.loss")) << b.dump();
  EXPECT_GT(a["critic.loss"].get<double>(), 0.0);
  // One trained model: its loss is the line's "loss".
  near(b["loss"].get<double>(), a["actor.loss"].get<double>() + a["critic.loss"].get<double>(), "loss");
  const double actor = a["actor.grad_norm"].get<double>(), critic = a["critic.grad_norm"].get<double>();
  near(b["actor.grad_norm"].get<double>(), std::sqrt(actor * actor + critic * critic), "actor.grad_norm");

  const fs::path config = root_ / "ppo_shared.toml";
  const std::vector<nlohmann::json> zero = train_stage(root_, "ppo", "ppo_shared_zero", rl_config(root_, "ppo_shared_zero_run", 1,
      rl + "shared_trunk = true\n") + "[models.actor.memory]\nstrategy = \"zero2\"\n");
  ASSERT_EQ(zero.size(), 1u);
  for (const char* key : {"loss", "actor.grad_norm"}) near(zero[0][key].get<double>(), b[key].get<double>(), key);

  const testing::CommandResult eval = chat("ppo eval --config " + config.string());
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  const testing::CommandResult exported = chat("ppo export --config " + config.string() + " --out " + (root_ / "ppo_shared_hf").string());
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const nlohmann::json written = nlohmann::json::parse(read_file((root_ / "ppo_shared_hf/config.json").string()));
  EXPECT_EQ(written["architectures"][0], "OPTForCausalLM");
  opt::OPTForCausalLM loaded = opt::opt_format().load((root_ / "ppo_shared_hf").string());
  EXPECT_EQ(loaded->config.num_hidden_layers, 2);

  const std::vector<nlohmann::json> gemini = train_stage(root_, "ppo", "ppo_shared_gemini", rl_config(root_, "ppo_shared_gemini_run", 1,
      rl + "shared_trunk = true\n") + "[models.actor.memory]\nstrategy = \"gemini\"\n");
  ASSERT_EQ(gemini.size(), 1u);
  for (const char* key : {"reward", "loss", "value_loss", "actor.grad_norm"}) near(gemini[0][key].get<double>(), b[key].get<double>(), key);
}

// A critic that starts from the SFT folder (a trunk without a value head), left described under ZeRO-2
// and Gemini: its strategy reads the trunk from the folder into its chunks and starts the head at zero,
// as the materialised critic starts. The first step equals the plain run's: the same values (value
// loss), critic loss and gradient norms (float32, the same sums in chunk order: 1e-5 relative).
TEST_F(ChatPipelineTest, ACriticLeftDescribedStartsAsAMaterialisedOne) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  std::vector<nlohmann::json> first;
  for (const std::string strategy : {"none", "zero2", "gemini"}) {
    const std::string name = "ppo_critic_" + strategy;
    const std::vector<nlohmann::json> lines = train_stage(root_, "ppo", name, rl_config(root_, name + "_run", 1,
        "prompts_per_rollout = 8\ncritic_init = \"" + (root_ / "sft_hf").string() + "\"\n") +
        "[models.critic.memory]\nstrategy = \"" + strategy + "\"\n");
    ASSERT_EQ(lines.size(), 1u) << strategy;
    first.push_back(lines[0]);
  }
  EXPECT_GT(first[0]["critic.grad_norm"].get<double>(), 0.0);
  // Evaluating such a config makes every model whole.
  const testing::CommandResult eval = chat("ppo eval --config " + (root_ / "ppo_critic_zero2.toml").string());
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
  for (size_t run = 1; run < first.size(); ++run) {
    for (const char* key : {"reward", "value_loss", "critic.loss", "critic.grad_norm", "actor.grad_norm"}) {
      const double want = first[0][key].get<double>();
      EXPECT_NEAR(first[run][key].get<double>(), want, 1e-5 * std::max(1.0, std::abs(want))) << key << " run " << run;
    }
  }
}

// The pre-training (ptx) term: the actor's loss is the policy loss plus rl.ptx_coef x the language-model
// loss of a batch of data.train, the same batch in every run of the same seed: at the first step the
// actor's loss grows linearly in ptx_coef (coefficients 0, 0.5, 1: the same rollout, float32 1e-5
// relative). The term is a second backward pass of the actor, through its sites: under ZeRO-2 with
// activation checkpointing and under Gemini (which gathers each part once per backward, so a second
// pass before the same backward would break it) the loss and the gradient's norm equal the plain run's
// (1e-5 relative: the same float32 sums, chunked), and the norm is not the run without ptx's.
TEST_F(ChatPipelineTest, PtxAddsTheLanguageModelLossUnderEveryStrategy) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  std::map<std::string, double> loss, norm;
  for (const auto& [name, coef, extra] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"ptx0", "0.0", ""}, {"ptx05", "0.5", ""}, {"ptx1", "1.0", ""},
           {"ptx1_zero", "1.0", "[models.actor.memory]\nstrategy = \"zero2\"\nactivation_checkpointing = true\n"},
           {"ptx1_gemini", "1.0", "[models.actor.memory]\nstrategy = \"gemini\"\n"}}) {
    const std::vector<nlohmann::json> lines =
        train_stage(root_, "ppo", name, rl_config(root_, name + "_run", 1, "prompts_per_rollout = 8\nptx_coef = " + coef + "\n") + extra);
    ASSERT_EQ(lines.size(), 1u) << name;
    loss[name] = lines[0]["actor.loss"].get<double>();
    norm[name] = lines[0]["actor.grad_norm"].get<double>();
  }
  const double half = loss["ptx05"] - loss["ptx0"], whole = loss["ptx1"] - loss["ptx0"];
  EXPECT_GT(whole, 0.5) << "a language-model loss of the tiny task";
  EXPECT_NEAR(whole, 2 * half, 1e-5 * std::max(1.0, std::abs(whole)));
  for (const char* run : {"ptx1_zero", "ptx1_gemini"}) {
    EXPECT_NEAR(loss[run], loss["ptx1"], 1e-5 * std::max(1.0, std::abs(loss["ptx1"]))) << run;
    EXPECT_NEAR(norm[run], norm["ptx1"], 1e-5 * norm["ptx1"]) << run;
  }
  EXPECT_GT(std::abs(norm["ptx1"] - norm["ptx0"]), 1e-3 * norm["ptx0"]) << "the ptx pass reaches the gradient";
}

// A run resumed between a rollout's steps trains on the rollout the earlier weights sampled, with the
// adaptive KL coefficient and the scores' running moments where they were: rollouts of 4 steps (2 epochs x
// 2 mini-batches, β adapted to a target), checkpoints every 2 steps; the newer ones (steps 8, 10) removed,
// the run resumes at step 6, in the middle of the second rollout, and its steps 7 to 10 (the third rollout
// scaled by the restored moments) are the uninterrupted run's to the bit.
TEST_F(ChatPipelineTest, PpoResumedMidRolloutGoesOnAsTheUninterruptedRun) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  const std::string args = "--set train.batch_size=4 --set train.checkpoint_interval=2 --set train.keep_checkpoints=4";
  // Scores scaled by their running moments, which the third rollout (step 9) takes from the checkpoint.
  auto config = [&](const std::string& name) {
    return rl_config(root_, name + "_run", 10, "prompts_per_rollout = 8\nepochs = 2\nmini_batches = 2\nkl_target = 1.0\n"
                                               "score_scaling = \"mean-std\"\nscore_clip = 3.0\n");
  };
  const std::vector<nlohmann::json> straight = train_stage(root_, "ppo", "ppo_straight", config("ppo_straight"), args);
  ASSERT_EQ(train_stage(root_, "ppo", "ppo_resumed", config("ppo_resumed"), args).size(), 10u);
  const fs::path checkpoints = root_ / "ppo_resumed_run" / "checkpoints";
  ASSERT_TRUE(fs::exists(fs::path(train::checkpoint_folder(checkpoints.string(), 6)) / "task_rank0.safetensors"));
  for (const int64_t later : {8, 10}) fs::remove_all(train::checkpoint_folder(checkpoints.string(), later));
  write_file_atomic((checkpoints / "latest").string(), "step_00000006\n");
  const std::vector<nlohmann::json> resumed = train_stage(root_, "ppo", "ppo_resumed", config("ppo_resumed"), args);
  ASSERT_EQ(straight.size(), 10u);
  ASSERT_EQ(resumed.size(), 10u);
  EXPECT_NE(straight[4]["kl_coef"], straight[0]["kl_coef"]) << "the coefficient adapted between the rollouts";
  // The rollout's seconds (sampling, scoring) come with the step that made it, steps 1, 5 and 9, and no other.
  for (size_t i = 0; i < 10; ++i) {
    for (const char* key : {"generate_s", "experience_s"}) {
      EXPECT_EQ(straight[i].contains(key), i % 4 == 0) << key << " at step " << i + 1;
      if (i % 4 == 0) {
        EXPECT_GT(straight[i][key].get<double>(), 0.0) << key << " at step " << i + 1;
      }
    }
  }
  for (size_t i = 6; i < 10; ++i) {
    for (const char* key : {"reward", "kl", "kl_coef", "response_length", "actor.loss", "critic.loss", "actor.grad_norm",
                            "critic.grad_norm", "ratio"}) {
      EXPECT_EQ(resumed[i][key], straight[i][key]) << key << " at step " << i + 1;
    }
  }
}

// generate.max_new_tokens far past the context is bounded by it, with a line saying so.
TEST_F(ChatPipelineTest, GenerationIsBoundedByTheContext) {
  ASSERT_EQ(sft_exported_.exit_code, 0) << sft_exported_.output;
  const testing::CommandResult r = chat("sft generate --config " + (root_ / "sft.toml").string() +
                                        " --set generate.max_new_tokens=1000000000 --prompt 'What does w3 mean?'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("generate.max_new_tokens = 1000000000 bounded to"), std::string::npos) << r.output;
  EXPECT_TRUE(testing::last_json_line(r.output).contains("output")) << r.output;
}

TEST_F(ChatPipelineTest, GrpoWithoutKlHasLossZeroAtItsFirstStep) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  const std::vector<nlohmann::json> lines = train_stage(root_, "grpo", "grpo", rl_config(root_, "grpo_run", 2,
      "prompts_per_rollout = 2\ngroup_size = 4\nkl_coef = 0.0\nepochs = 1\nmini_batches = 1\n"));
  ASSERT_EQ(lines.size(), 2u);
  // Ratio 1 and group advantages summing to 0 per group: the sequence-mean loss is 0 up to rounding.
  EXPECT_LT(std::abs(lines[0]["loss"].get<double>()), 1e-6) << lines[0].dump();
  EXPECT_NEAR(lines[0]["ratio"].get<double>(), 1.0, 1e-5);
  // One update per rollout scores the policy itself (no experience pass of the actor): the KL figure
  // comes from it, 0 while the actor is its reference, then the moved policy's.
  EXPECT_LT(std::abs(lines[0]["kl"].get<double>()), 1e-4) << lines[0].dump();
  EXPECT_NE(lines[1]["kl"].get<double>(), 0.0) << lines[1].dump();
  EXPECT_TRUE(std::isfinite(lines[1]["kl"].get<double>()));
}

// DAPO's dynamic sampling (rl.sampling_rounds): a rollout keeps only groups whose program rewards differ
// (a group of equal rewards has advantage 0 everywhere), drawing further prompts until it has its groups.
// The reward is the format term with a pattern a fifth of the responses match; without dynamic sampling
// the same rollout holds groups without spread, with it none, and it took more than one round.
TEST_F(ChatPipelineTest, DynamicSamplingKeepsOnlyGroupsWithSpread) {
  ASSERT_EQ(sft_exported_.exit_code, 0) << sft_exported_.output;
  const int64_t groups = 8, group = 4;
  const auto rollout = [&](const std::string& name, int rounds) {
    const std::vector<nlohmann::json> lines = train_stage(root_, "grpo", name, rl_config(root_, name + "_run", 1,
        "prompts_per_rollout = " + std::to_string(groups) + "\ngroup_size = " + std::to_string(group) +
        "\nrewards = [\"format\"]\nformat_pattern = \"i\"\nsampling_rounds = " + std::to_string(rounds) + "\n", /*reward_model=*/""),
        "--set train.checkpoint_interval=1 --set train.batch_size=" + std::to_string(groups * group));
    EXPECT_EQ(lines.size(), 1u);
    const io::SafetensorsFile state = io::load_safetensors(
        fs::path(train::checkpoint_folder((root_ / (name + "_run") / "checkpoints").string(), 1)) / "task_rank0.safetensors");
    const torch::Tensor* scores = state.find("experience.scores");
    EXPECT_TRUE(scores) << "the checkpoint keeps its rollout";
    int64_t without_spread = 0;
    if (scores) {
      EXPECT_EQ(scores->numel(), groups * group);
      const torch::Tensor by_group = scores->reshape({groups, group});
      without_spread = (by_group.amax(1) == by_group.amin(1)).sum().item<int64_t>();
    }
    return std::make_pair(without_spread, lines.empty() ? nlohmann::json() : lines[0]);
  };
  const auto [plain_without, plain] = rollout("grpo_sampled_once", 1);
  ASSERT_GT(plain_without, 0) << "every group already has spread: the pattern cannot tell the runs apart";
  EXPECT_FALSE(plain.contains("groups_with_spread")) << plain.dump();
  const auto [dynamic_without, dynamic] = rollout("grpo_dynamic", 8);
  EXPECT_EQ(dynamic_without, 0);
  EXPECT_EQ(dynamic.value("groups_with_spread", 0.0), 1.0) << dynamic.dump();
  EXPECT_GT(dynamic.value("sampling_rounds", 0.0), 1.0) << dynamic.dump();
  // It filters on the program's rewards: without rl.rewards it is refused by name.
  const fs::path refused = write_config(root_, "grpo_dynamic_rm", rl_config(root_, "grpo_dynamic_rm_run", 1,
      "prompts_per_rollout = 4\ngroup_size = 4\nsampling_rounds = 4\n"));
  const testing::CommandResult r = chat("grpo --config " + refused.string() + " --set train.batch_size=16");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(testing::Contains(r.output, "rl.sampling_rounds")) << r.output;
}

// Learning, not only consistency: GRPO and PPO raise a reward a program checks (the format term: 1 for a
// response holding an "i", which about a fifth of the SFT model's samples do) within 16 steps, the mean
// of the last four steps' sampled rewards at least 0.2 above the first four's. A policy gradient of the
// wrong sign, or log-probabilities of another distribution than the sampled one, would not.
TEST_F(ChatPipelineTest, GrpoAndPpoRaiseARewardAProgramChecks) {
  ASSERT_EQ(sft_exported_.exit_code, 0) << sft_exported_.output;
  const std::string reward = "rewards = [\"format\"]\nformat_pattern = \"i\"\n";
  for (const std::string stage : {"grpo", "ppo"}) {
    SCOPED_TRACE(stage);
    const std::string rl = stage == "grpo" ? "prompts_per_rollout = 8\ngroup_size = 4\nkl_coef = 0.0\n"
                                           : "prompts_per_rollout = 16\nepochs = 1\nmini_batches = 1\nkl_coef = 0.0\n";
    const std::vector<nlohmann::json> lines = train_stage(root_, stage, stage + "_learns", rl_config(root_, stage + "_learns_run", 16,
        rl + reward, /*reward_model=*/""), std::string("--set optim.lr=3e-3 --set train.batch_size=") + (stage == "grpo" ? "32" : "16"));
    ASSERT_EQ(lines.size(), 16u);
    auto mean_reward = [&](size_t first) {
      double sum = 0;
      for (size_t i = first; i < first + 4; ++i) sum += lines[i]["reward"].get<double>();
      return sum / 4;
    };
    EXPECT_GT(mean_reward(12), mean_reward(0) + 0.2) << lines.front().dump() << "\n" << lines.back().dump();
  }
}

TEST_F(ChatPipelineTest, BadStageInputIsNamed) {
  const testing::CommandResult unknown = chat("rlhf --config x.toml");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.output.find("unknown stage \"rlhf\""), std::string::npos) << unknown.output;
  const fs::path missing = write_config(root_, "missing", rl_config(root_, "missing_run", 1, "prompts_per_rollout = 8\n"));
  std::ofstream(missing, std::ios::app) << "";
  const testing::CommandResult no_reward = chat("ppo --config " + missing.string() + " --set rl.reward_model='\"\"'");
  EXPECT_EQ(no_reward.exit_code, 1);
  EXPECT_NE(no_reward.output.find("rl.reward_model"), std::string::npos) << no_reward.output;
  const testing::CommandResult no_folder = chat("chat --model " + (root_ / "nowhere").string() + " --prompt hello");
  EXPECT_EQ(no_folder.exit_code, 1);
  EXPECT_NE(no_folder.output.find("nowhere is not a folder"), std::string::npos) << no_folder.output;
  const testing::CommandResult bad_option = chat("chat --model " + (root_ / "sft_hf").string() + " --warmth 3");
  EXPECT_EQ(bad_option.exit_code, 1);
  EXPECT_NE(bad_option.output.find("unknown setting \"warmth\""), std::string::npos) << bad_option.output;
  const testing::CommandResult bad_batch = chat("ppo --config " + missing.string() + " --set rl.mini_batches=3");
  EXPECT_EQ(bad_batch.exit_code, 1);
  EXPECT_NE(bad_batch.output.find("train.batch_size"), std::string::npos) << bad_batch.output;
  // Each refused when the config is read, naming its key (nan once failed at step 1 with advice about the
  // learning rate; 1e9 new tokens was blamed on data.train; a clip range of 0 was taken).
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"rl.missing_eos_penalty=nan", "key 'rl.missing_eos_penalty' at --set rl.missing_eos_penalty=nan: expected a finite number"},
      {"generate.max_new_tokens=1000000000", "generate.max_new_tokens"},
      {"rl.clip=0", "rl.clip"}};
  for (const auto& [setting, named] : refused) {
    const testing::CommandResult bad = chat("ppo --config " + missing.string() + " --set " + setting);
    EXPECT_EQ(bad.exit_code, 1) << setting;
    EXPECT_NE(bad.output.find(named), std::string::npos) << setting << "\n" << bad.output;
    EXPECT_EQ(bad.output.find("data.train"), std::string::npos) << setting << "\n" << bad.output;
  }
}

// A reward model whose tokenizer is another (the same size, two tokens' ids swapped) would score ids it
// does not read: refused by its key before anything trains. It once trained without a word.
TEST_F(ChatPipelineTest, AReferenceOrRewardModelOfAnotherTokenizerIsRefused) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  // A copy of `folder` whose vocabulary has the ids of "a" and "b" swapped.
  auto other_tokens = [&](const std::string& folder) {
    const fs::path other = root_ / (folder + "_other_tokens");
    fs::remove_all(other);
    fs::copy(root_ / folder, other, fs::copy_options::recursive);
    nlohmann::json vocab = nlohmann::json::parse(read_file((other / "vocab.json").string()));
    std::swap(vocab["a"], vocab["b"]);
    write_file_atomic((other / "vocab.json").string(), vocab.dump());
    return other;
  };
  const fs::path path = write_config(root_, "other_tokens", rl_config(root_, "other_tokens_run", 1, "prompts_per_rollout = 8\n"));
  for (const auto& [key, folder] : {std::pair<std::string, std::string>{"rl.reward_model", "rm_hf"}, {"rl.reference", "sft_hf"}}) {
    const testing::CommandResult refused =
        chat("ppo --config " + path.string() + " --set " + key + "='\"" + other_tokens(folder).string() + "\"'");
    EXPECT_EQ(refused.exit_code, 1) << key;
    EXPECT_TRUE(testing::Contains(refused.output, "key '" + key + "'")) << refused.output;
    EXPECT_TRUE(testing::Contains(refused.output, "has another tokenizer than data.tokenizer")) << refused.output;
  }
  EXPECT_FALSE(fs::exists(root_ / "other_tokens_run" / "checkpoints"));
}

// PPO's fit check counts each model as its own section holds it: the actor and the critic train (float32
// weights and gradients and AdamW's two moments: 16 bytes a parameter), the frozen reference and reward
// model are weights alone in their compute dtype (bf16 here: 2 bytes; float32: 4). It once counted four
// trained actors from the top-level keys.
TEST_F(ChatPipelineTest, PpoFitCheckCountsEachModelFromItsOwnSection) {
  const fs::path path = write_config(root_, "fit", rl_config(root_, "fit_run", 1, "prompts_per_rollout = 8\n") +
                                                       "[models.reference.precision]\ndtype = \"bf16\"\n");
  const config::Config config = config::Config::load(path.string(), stage_schema(Stage::Ppo), {"optim.name=\"adamw\""});
  const train::ModelSize size = make_rl_app(config, Stage::Ppo)->model_size();
  ASSERT_EQ(size.models.size(), 4u);
  const double actor = static_cast<double>(opt::read_lm_shape(io::read_hf_config((root_ / "sft_hf").string()), "sft").parameter_count());
  const double reward = static_cast<double>(opt::read_lm_shape(io::read_hf_config((root_ / "rm_hf").string()), "rm").parameter_count());
  EXPECT_EQ(size.models[0].name, "actor");
  EXPECT_EQ(size.models[1].name, "critic");  // started from the reward model's folder
  EXPECT_EQ(size.models[2].name, "reference");
  EXPECT_EQ(size.models[3].name, "reward");
  EXPECT_FALSE(size.models[2].trained);
  EXPECT_FALSE(size.models[3].trained);
  train::Runtime runtime = train::start_runtime(config, dist::World::single());
  const double expected = 16 * actor + 16 * reward + 2 * actor + 4 * reward;
  EXPECT_NEAR(train::least_run_bytes(config, runtime, size.models), expected, 1e-9 * expected);
  EXPECT_DOUBLE_EQ(size.parameters, 2 * actor + 2 * reward);
  // Each size from the model's recipe: its settings named, the folders' keys among them.
  for (const char* key : {"model.hidden_size", "model.init_from", "rl.reward_model"}) {
    EXPECT_NE(std::find(size.keys.begin(), size.keys.end(), key), size.keys.end()) << key;
  }
  // export and generate make the actor alone; the benchmark draws the other three at the actor's shape.
  const std::unique_ptr<train::App> app = make_rl_app(config, Stage::Ppo);
  const train::ModelSize built = app->built_model_size();
  EXPECT_DOUBLE_EQ(built.parameters, actor);
  EXPECT_TRUE(built.models.empty());
  const train::ModelSize benchmarked = app->benchmark_size();
  ASSERT_EQ(benchmarked.models.size(), 4u);
  EXPECT_DOUBLE_EQ(benchmarked.parameters, 4 * actor);
  EXPECT_TRUE(benchmarked.models[1].trained);  // the critic
  EXPECT_FALSE(benchmarked.models[2].trained);
}

// A PPO run reads each model's memory strategy and compute dtype once: the fit check, the recipe's builder
// and the model's state or frozen model take them from one reading of the model's own section
// (train::held_model). The actor's strategy was read four times through two views, one of them the
// top-level keys, and each model's dtype three times.
TEST_F(ChatPipelineTest, APpoRunReadsEachModelsMemoryStrategyAndDtypeOnce) {
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  const config::Config config = config::Config::from_string(
      rl_config(root_, "reads_run", 1, "prompts_per_rollout = 8\n") + "[models.actor.memory]\nstrategy = \"zero2\"\n",
      "reads.toml", stage_schema(Stage::Ppo));
  train::Runtime runtime = train::start_runtime(config, dist::World::single());
  const std::unique_ptr<train::App> app = make_rl_app(config, Stage::Ppo);
  train::check_model_fits(app->model_size(), config, runtime);
  const std::unique_ptr<train::RunTask> task = app->make_task(runtime.model_options(), &runtime);
  // The actor is left described for its own section's ZeRO-2, the critic (top level: none) is not.
  const std::vector<train::RunModel> models = task->models();
  ASSERT_EQ(models[0].name, "actor");
  EXPECT_TRUE(static_cast<bool>(models[0].deferred));
  ASSERT_EQ(models[1].name, "critic");
  EXPECT_FALSE(static_cast<bool>(models[1].deferred));
  const train::Trainer trainer(config, runtime, *task);
  for (const char* model : {"actor", "critic", "reference", "reward"}) {
    EXPECT_EQ(config.reads("models." + std::string(model) + ".memory.strategy"), 1) << model;
    EXPECT_EQ(config.reads("models." + std::string(model) + ".precision.dtype"), 1) << model;
  }
}

// A line the session cannot answer (bytes that are not text, a message longer than the context) is a
// notice and the prompt again, not the end of the conversation.
TEST_F(ChatPipelineTest, AnUnanswerableLineKeepsTheSession) {
  const fs::path input = root_ / "unanswerable_input.txt";
  {
    std::ofstream out(input, std::ios::binary);
    std::string noise(4096, '\0');
    uint32_t state = 12345;
    for (char& c : noise) {
      state = state * 1664525u + 1013904223u;
      c = static_cast<char>(state >> 24);
      if (c == '\n') c = '\x80';
    }
    out << noise << "\n" << std::string(1 << 20, 'w') << "\n" << "What does w3 mean?\n/quit\n";
  }
  const testing::CommandResult session =
      chat("chat --model " + (root_ / "sft_hf").string() + " --max-new-tokens 4 < " + input.string());
  EXPECT_EQ(session.exit_code, 0) << session.output.substr(0, 2000);
  EXPECT_NE(session.output.find("(not answered: "), std::string::npos) << session.output.substr(0, 2000);
  // The third line is answered: a prompt follows its reply, and the session ends at /quit.
  EXPECT_GE(std::count(session.output.begin(), session.output.end(), '>'), 4) << session.output.substr(0, 2000);
}

// Every shipped config loads against its stage's schema (the stage from its name).
TEST(ChatConfigsTest, EveryShippedConfigValidates) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(KUAFU_SOURCE_DIR) / "apps/chat_rlhf/configs")) {
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    const Stage stage = name.find("grpo") != std::string::npos  ? Stage::Grpo
                        : name.find("ppo") != std::string::npos ? Stage::Ppo
                        : name.find("dpo") != std::string::npos ? Stage::Dpo
                        : name.find("rm") != std::string::npos  ? Stage::Reward
                                                                : Stage::Sft;
    const config::Config config = config::Config::load(entry.path().string(), stage_schema(stage));
    if (stage == Stage::Ppo || stage == Stage::Grpo) {
      EXPECT_GT(rl_settings(config, stage).prompts_per_rollout, 0);
    }
    ++count;
  }
  EXPECT_GE(count, 9);
}

// A conversation keeps its turns (each rendered after the ones before), streams its reply in pieces
// that add up to the reply, drops its oldest turns with a notice when the context fills, and /reset
// clears it.
TEST_F(ChatPipelineTest, ChatSessionStreamsKeepsHistoryAndDropsTheOldest) {
  ASSERT_EQ(sft_exported_.exit_code, 0) << sft_exported_.output;
  const std::string dir = (root_ / "sft_hf").string();
  auto tokenizer = std::make_shared<io::BpeTokenizer>(io::BpeTokenizer::from_folder(dir));
  io::InstructionFormat format;
  format.bos = format.eos = 2;
  nn::SamplingOptions sampling;
  sampling.temperature = 0;
  sampling.max_new_tokens = 10;
  ChatSession session(opt::load_causal_lm(dir), tokenizer, format, sampling);
  std::vector<std::string> pieces, notices;
  const std::string first = session.reply("What does w3 mean?", [&](const std::string& p) { pieces.push_back(p); },
                                          [&](const std::string& n) { notices.push_back(n); });
  std::string joined;
  for (const std::string& p : pieces) joined += p;
  EXPECT_EQ(joined, first);
  EXPECT_GT(pieces.size(), 1u) << "the reply arrives as it is generated, not at the end";
  // Long messages fill the 64 positions: the oldest turns go, with a notice.
  for (int i = 0; i < 4 && notices.empty(); ++i) {
    session.reply("What does w" + std::to_string(i) + " mean, and what does w" + std::to_string(i + 1) + " mean?",
                  [](const std::string&) {}, [&](const std::string& n) { notices.push_back(n); });
  }
  ASSERT_FALSE(notices.empty());
  EXPECT_NE(notices[0].find("oldest turn"), std::string::npos) << notices[0];
  EXPECT_GE(session.turns().size(), 1u);
  session.reset();
  EXPECT_TRUE(session.turns().empty());
  session.set("temperature", "0.7");
  EXPECT_EQ(session.sampling().temperature, 0.7);
  EXPECT_THROW(session.set("warmth", "1"), Error);
  EXPECT_THROW(session.set("top_p", "lots"), Error);
}

// kuafu-chat chat through a real terminal (tmux): it answers, /set and /reset answer, /quit leaves with
// exit code 0, and so does Ctrl-C at the prompt.
TEST_F(ChatPipelineTest, ChatThroughARealTerminal) {
  ASSERT_EQ(sft_exported_.exit_code, 0) << sft_exported_.output;
  const std::string session = "kuafu_chat_test_" + std::to_string(::getpid());
  // Each pass has its own tmux server (socket): a server whose last session was just killed may still be
  // exiting when the next pass starts one, and new-session then fails on the dying socket.
  std::string socket;
  auto tmux = [&](const std::string& args) { return testing::run_command("tmux -L " + socket + " " + args); };
  auto screen = [&] { return tmux("capture-pane -p -t " + session).output; };
  // `text` at least `count` times on the screen; ">" counts the prompts (lines beginning with it: tmux
  // drops the space after it).
  auto wait_for = [&](const std::string& text, int count) {
    for (int i = 0; i < 600; ++i) {
      const std::string s = "\n" + screen();
      const std::string needle = text == "> " ? "\n>" : text;
      size_t found = 0, at = 0;
      while ((at = s.find(needle, at)) != std::string::npos) ++found, at += needle.size();
      if (found >= static_cast<size_t>(count)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  };
  // The session goes whatever the test's outcome (a failed assertion returns early).
  struct KillServer {
    const std::string& socket;
    ~KillServer() { testing::run_command("tmux -L " + socket + " kill-server 2>/dev/null"); }
  } kill_at_end{socket};
  for (const std::string leave : {"/quit", "C-c"}) {
    SCOPED_TRACE(leave);
    testing::run_command("tmux -L " + socket + " kill-server 2>/dev/null");
    socket = session + (leave == "C-c" ? "_interrupt" : "_quit");
    const std::string command = std::string(KUAFU_CHAT_PATH) + " chat --model " + (root_ / "sft_hf").string() +
                                " --max-new-tokens 12; echo EXIT=$?; sleep 30";
    const auto started = tmux("new-session -d -s " + session + " -x 160 -y 40 '" + command + "'");
    ASSERT_EQ(started.exit_code, 0) << started.output;
    ASSERT_TRUE(wait_for("> ", 1)) << screen();
    tmux("send-keys -t " + session + " 'What does w3 mean?' Enter");
    ASSERT_TRUE(wait_for("> ", 2)) << screen();
    tmux("send-keys -t " + session + " '/set temperature 0.5' Enter");
    ASSERT_TRUE(wait_for("(temperature = 0.5)", 1)) << screen();
    tmux("send-keys -t " + session + " '/reset' Enter");
    ASSERT_TRUE(wait_for("(conversation cleared)", 1)) << screen();
    ASSERT_TRUE(wait_for("> ", 4)) << screen();
    tmux("send-keys -t " + session + (leave == "C-c" ? " C-c" : " '/quit' Enter"));
    EXPECT_TRUE(wait_for("EXIT=0", 1)) << screen();
    const std::string answered = screen();
    const size_t question = answered.find("What does w3 mean?");
    ASSERT_NE(question, std::string::npos);
    const size_t reply_start = answered.find('\n', question) + 1;
    EXPECT_NE(answered.substr(reply_start, 2), "> ") << "an answer follows the question:\n" << answered;
    tmux("kill-server");
  }
}

}  // namespace
}  // namespace kuafu::chat
