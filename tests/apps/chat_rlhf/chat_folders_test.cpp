// Every kuafu-chat stage from a folder that transformers saved (tests/python/rlhf_models_reference.py
// gpt2_start, llama_start), for each family the stages take from a folder alone: GPT-2, and the Llama
// family (a LlamaForCausalLM with grouped-query attention, heads wider than hidden / heads and an untied
// head), each with one special token <|endoftext|> as BOS, EOS and padding (no pad token). SFT lowers the
// held-out answer loss and exports the family's causal LM whose next-token log-probabilities transformers
// computes as Kuafu does; the reward model from the SFT folder exports the family's
// ForSequenceClassification with Kuafu's scores; DPO, PPO and GRPO start from both with the exact
// first-step figures each must show (DPO's loss log 2; PPO's ratio 1, no clipping, no approximate KL;
// GRPO's loss 0 with β = 0), the PPO actor's export loads in transformers, and `chat` answers from it;
// LoRA's merged export and PEFT adapter give the adapted model's outputs in transformers and PEFT.
// Parity in float32 to 1e-5: the libraries' kernels sum in other orders (~1e-6 on these sizes).
#include <gtest/gtest.h>

#include <cmath>

#include "apps/chat_rlhf/policy.h"
#include "apps/chat_rlhf/scored_model.h"
#include "core/io/safetensors.h"
#include "core/util/atomic_file.h"
#include "tests/apps/chat_rlhf/stage_runs.h"
#include "tests/support/multiprocess.h"
#include "tests/support/python_reference.h"
#include "tests/support/test_util.h"

namespace kuafu::chat {
namespace {

constexpr int64_t kEos = 0;  // <|endoftext|>

// What differs between the families' folders.
struct Gpt2Folders {
  static constexpr const char* kStart = "gpt2_start";  // rlhf_models_reference.py's command and folder
  static constexpr const char* kFamily = "GPT-2";
  static constexpr const char* kDescribed = "GPT-2: 2 layers";
  static constexpr const char* kCausalLM = "GPT2LMHeadModel";
  static constexpr const char* kClassifier = "GPT2ForSequenceClassification";
  static constexpr const char* kModelType = "gpt2";
  // GPT-2's fused attention projection, a Conv1D whose weight is [in, out] (PEFT's fan_in_fan_out).
  static constexpr const char* kLoraTargets = "[\"c_attn\"]";
  static constexpr bool kFanInFanOut = true;
  static constexpr const char* kChatTemplate = nullptr;  // the plain framing
};
struct LlamaFolders {
  static constexpr const char* kStart = "llama_start";
  static constexpr const char* kFamily = "Llama";
  static constexpr const char* kDescribed = "Llama: 2 layers, 4 heads (2 key-value) of 12";
  static constexpr const char* kCausalLM = "LlamaForCausalLM";
  static constexpr const char* kClassifier = "LlamaForSequenceClassification";
  static constexpr const char* kModelType = "llama";
  static constexpr const char* kLoraTargets = "[\"q_proj\", \"v_proj\", \"gate_proj\"]";
  static constexpr bool kFanInFanOut = false;
  // The tokenizer folder's chat template, so every stage frames its data by it: a role's initial before
  // each turn, each turn closed by the EOS the template writes (the end of turn generation stops at). Short,
  // so the tiny task's examples stay within data.context.
  static constexpr const char* kChatTemplate =
      "{{- bos_token }}{%- for m in messages %}{{- m['role'][0] + ': ' + m['content'] | trim + eos_token }}{%- endfor %}"
      "{%- if add_generation_prompt %}{{- 'a: ' }}{%- endif %}";
};

// Rows of the tiny task's tokens (BOS, prompt, answer, EOS), left-padded with the EOS id: ids [B, T], mask [B, T].
std::pair<torch::Tensor, torch::Tensor> left_padded_rows() {
  const std::vector<std::string> texts = {"What does w3 mean? a bird", "What does w10 mean? very old of 3.", "w7?"};
  const int64_t width = 40;
  torch::Tensor ids = torch::full({3, width}, kEos, torch::kInt64), mask = torch::zeros({3, width}, torch::kInt64);
  for (int64_t r = 0; r < 3; ++r) {
    std::vector<int64_t> row = {kEos};
    for (const char c : texts[static_cast<size_t>(r)]) row.push_back(c == ' ' ? 32 : static_cast<unsigned char>(c));
    row.push_back(kEos);
    const int64_t n = static_cast<int64_t>(row.size()), first = width - n;
    ids.narrow(1, first, n).narrow(0, r, 1).copy_(torch::tensor(row).unsqueeze(0));
    mask.narrow(1, first, n).narrow(0, r, 1).fill_(1);
  }
  return {ids, mask};
}

// Kuafu's next-token log-probabilities of `folder`'s causal model (of `family`) on left_padded_rows, written
// beside it for the Python reference as <folder>_expected.safetensors.
fs::path kuafu_logprobs(const fs::path& folder, const std::string& family) {
  nn::CausalLMPtr model = opt::load_causal_lm(folder.string());
  EXPECT_EQ(model->family(), family);
  model->module().eval();
  torch::NoGradGuard no_grad;
  const auto [ids, mask] = left_padded_rows();
  const fs::path expected = folder.parent_path() / (folder.filename().string() + "_expected.safetensors");
  io::save_safetensors(expected.string(), {{"left_ids", ids},
                                           {"left_mask", mask},
                                           {"lm_logprobs", next_token_logprobs(*model, ids, mask.to(torch::kBool))}});
  return expected;
}

// The reference `command` (check_lm or check_peft) agrees with Kuafu's log-probabilities on real tokens.
void expect_reference_agrees(const std::string& command, const std::string& architecture) {
  const testing::PythonRun run = testing::run_python_reference("rlhf_models_reference.py", command);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json line = testing::last_json_line(run.output);
  EXPECT_EQ(line["architecture"], architecture);
  EXPECT_LT(line["max_difference"].get<double>(), 1e-5) << command;
}

template <class Folders>
void expect_logprobs_as_transformers(const fs::path& folder) {
  expect_reference_agrees("check_lm " + folder.string() + " " + kuafu_logprobs(folder, Folders::kFamily).string(), Folders::kCausalLM);
}

nlohmann::json config_json(const fs::path& folder) { return nlohmann::json::parse(read_file((folder / "config.json").string())); }

template <class Folders>
class ChatFoldersTest : public ::testing::Test {
 protected:
  // One pipeline for the suite: the family's start, SFT from it and the reward model from the SFT model.
  static void SetUpTestSuite() {
    root_ = testing::shared_test_dir(std::string("chat_") + Folders::kModelType);
    fs::remove_all(root_);
    fs::create_directories(root_);
    write_data(root_, testing::SpecialTokens::kGpt2);
    if (Folders::kChatTemplate) {
      std::ofstream(root_ / "tokenizer/tokenizer_config.json")
          << nlohmann::json{{"bos_token", "<|endoftext|>"}, {"eos_token", "<|endoftext|>"}, {"chat_template", Folders::kChatTemplate}}.dump();
    }
    start_ = testing::run_python_reference("rlhf_models_reference.py", std::string(Folders::kStart) + " " + start_dir().string());
    const std::string data =
        "train = \"" + (root_ / "train.jsonl").string() + "\"\nval = \"" + (root_ / "val.jsonl").string() + "\"\n";
    const fs::path sft = write_config(root_, "sft", common_config(root_, "sft_run", 30, data) +
        "[model]\ninit_from = \"" + start_dir().string() + "\"\n[optim]\nlr = 3e-3\nwarmup_steps = 2\n");
    sft_trained_ = chat("sft --config " + sft.string());
    sft_before_ = chat("sft eval --config " + sft.string() + " --checkpoint init");
    sft_after_ = chat("sft eval --config " + sft.string());
    sft_exported_ = chat("sft export --config " + sft.string() + " --out " + (root_ / "sft_hf").string());
    const fs::path rm = write_config(root_, "rm", common_config(root_, "rm_run", 10,
        "train = \"" + (root_ / "train_pairs.jsonl").string() + "\"\nval = \"" + (root_ / "val_pairs.jsonl").string() + "\"\n") +
        "[model]\ninit_from = \"" + (root_ / "sft_hf").string() + "\"\n[optim]\nlr = 2e-3\nwarmup_steps = 2\n");
    rm_trained_ = chat("rm --config " + rm.string());
    rm_exported_ = chat("rm export --config " + rm.string() + " --out " + (root_ / "rm_hf").string());
  }
  static fs::path start_dir() { return root_ / Folders::kStart; }
  static inline fs::path root_;
  static inline testing::PythonRun start_;
  static inline testing::CommandResult sft_trained_, sft_before_, sft_after_, sft_exported_, rm_trained_, rm_exported_;
};
using Families = ::testing::Types<Gpt2Folders, LlamaFolders>;
TYPED_TEST_SUITE(ChatFoldersTest, Families);

TYPED_TEST(ChatFoldersTest, SftAndTheRewardModelStartFromAFolderAndExportTheFamilysClasses) {
  using Folders = TypeParam;
  const fs::path& root_ = this->root_;
  const testing::PythonRun& start_ = this->start_;
  const testing::CommandResult& sft_trained_ = this->sft_trained_;
  const testing::CommandResult& sft_before_ = this->sft_before_;
  const testing::CommandResult& sft_after_ = this->sft_after_;
  const testing::CommandResult& sft_exported_ = this->sft_exported_;
  const testing::CommandResult& rm_trained_ = this->rm_trained_;
  const testing::CommandResult& rm_exported_ = this->rm_exported_;
  ASSERT_EQ(start_.exit_code, 0) << start_.output;
  ASSERT_EQ(sft_trained_.exit_code, 0) << sft_trained_.output;
  EXPECT_TRUE(testing::Contains(sft_trained_.output, Folders::kDescribed)) << "the folder's family and shape";
  EXPECT_EQ(testing::Contains(sft_trained_.output, "chat template"), Folders::kChatTemplate != nullptr)
      << "the Llama folders' data is framed by their tokenizer's chat template, GPT-2's plainly";
  ASSERT_EQ(sft_before_.exit_code, 0) << sft_before_.output;
  ASSERT_EQ(sft_after_.exit_code, 0) << sft_after_.output;
  const double before = testing::last_json_line(sft_before_.output)["val_loss"].get<double>();
  const double after = testing::last_json_line(sft_after_.output)["val_loss"].get<double>();
  EXPECT_LT(after, 0.75 * before) << "the held-out answer loss falls from chance (log 128): " << before << " -> " << after;
  ASSERT_EQ(sft_exported_.exit_code, 0) << sft_exported_.output;
  EXPECT_EQ(config_json(root_ / "sft_hf")["architectures"][0], Folders::kCausalLM);
  EXPECT_TRUE(fs::exists(root_ / "sft_hf/vocab.json")) << "the tokenizer travels with the folder";
  expect_logprobs_as_transformers<Folders>(root_ / "sft_hf");

  ASSERT_EQ(rm_trained_.exit_code, 0) << rm_trained_.output;
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  const nlohmann::json rm = config_json(root_ / "rm_hf");
  EXPECT_EQ(rm["architectures"][0], Folders::kClassifier);
  EXPECT_EQ(rm["model_type"], Folders::kModelType);
  ScoredModel reward = load_scored_model((root_ / "rm_hf").string());
  reward->eval();
  torch::NoGradGuard no_grad;
  const auto [ids, mask] = left_padded_rows();
  io::NamedTensors expected;
  for (const std::string side : {"left", "right"}) {  // the same rows twice: transformers scores each alone
    expected.emplace_back(side + "_ids", ids);
    expected.emplace_back(side + "_mask", mask);
    expected.emplace_back(side + "_scores", reward->scores(ids, mask.to(torch::kBool)));
  }
  const fs::path expected_path = root_ / "rm_expected.safetensors";
  io::save_safetensors(expected_path.string(), expected);
  const testing::PythonRun run = testing::run_python_reference(
      "rlhf_models_reference.py", "check_rm " + (root_ / "rm_hf").string() + " " + expected_path.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json line = testing::last_json_line(run.output);
  EXPECT_EQ(line["architecture"], Folders::kClassifier);
  EXPECT_LT(line["max_difference"].get<double>(), 1e-5);
}

TYPED_TEST(ChatFoldersTest, DpoPpoAndGrpoStartFromTheFoldersWithTheirExactFirstSteps) {
  using Folders = TypeParam;
  const fs::path& root_ = this->root_;
  const testing::CommandResult& rm_exported_ = this->rm_exported_;
  ASSERT_EQ(rm_exported_.exit_code, 0) << rm_exported_.output;
  const std::vector<nlohmann::json> dpo = train_stage(root_, "dpo", "dpo", common_config(root_, "dpo_run", 2,
      "train = \"" + (root_ / "train_pairs.jsonl").string() + "\"\nval = \"" + (root_ / "val_pairs.jsonl").string() + "\"\n") +
      "[model]\ninit_from = \"" + (root_ / "sft_hf").string() + "\"\n[optim]\nlr = 1e-3\nwarmup_steps = 1\n[dpo]\nbeta = 0.1\n");
  ASSERT_EQ(dpo.size(), 2u);
  EXPECT_NEAR(dpo[0]["loss"].get<double>(), std::log(2.0), 1e-5) << "the policy is its reference at step 1";

  const std::vector<nlohmann::json> ppo = train_stage(root_, "ppo", "ppo", rl_config(root_, "ppo_run", 2,
      "prompts_per_rollout = 16\nepochs = 1\nmini_batches = 2\n"));
  ASSERT_EQ(ppo.size(), 2u);
  EXPECT_NEAR(ppo[0]["ratio"].get<double>(), 1.0, 1e-5);
  EXPECT_EQ(ppo[0]["clip_fraction"].get<double>(), 0.0);
  EXPECT_LT(ppo[0]["approx_kl"].get<double>(), 1e-10);
  EXPECT_LT(ppo[0]["kl"].get<double>(), 1e-4) << "the actor starts as its reference";
  const testing::CommandResult exported =
      chat("ppo export --config " + (root_ / "ppo.toml").string() + " --out " + (root_ / "ppo_hf").string());
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  expect_logprobs_as_transformers<Folders>(root_ / "ppo_hf");

  const std::vector<nlohmann::json> shared = train_stage(root_, "ppo", "ppo_shared", rl_config(root_, "ppo_shared_run", 1,
      "prompts_per_rollout = 8\nshared_trunk = true\n"));
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_NEAR(shared[0]["ratio"].get<double>(), 1.0, 1e-5) << "a value head on the " << Folders::kFamily << " trunk";

  const std::vector<nlohmann::json> grpo = train_stage(root_, "grpo", "grpo", rl_config(root_, "grpo_run", 1,
      "prompts_per_rollout = 2\ngroup_size = 4\nkl_coef = 0.0\nepochs = 1\nmini_batches = 1\n"));
  ASSERT_EQ(grpo.size(), 1u);
  EXPECT_LT(std::abs(grpo[0]["loss"].get<double>()), 1e-6) << grpo[0].dump();
  // GSPO (one ratio per response) starts on-policy too: ratio 1, loss 0 with β = 0.
  const std::vector<nlohmann::json> gspo = train_stage(root_, "grpo", "gspo", rl_config(root_, "gspo_run", 1,
      "prompts_per_rollout = 2\ngroup_size = 4\nkl_coef = 0.0\nepochs = 1\nmini_batches = 1\n"
      "importance_sampling = \"sequence\"\nloss_aggregation = \"sequence-mean\"\n"));
  ASSERT_EQ(gspo.size(), 1u);
  EXPECT_LT(std::abs(gspo[0]["loss"].get<double>()), 1e-6) << gspo[0].dump();
  EXPECT_NEAR(gspo[0]["ratio"].get<double>(), 1.0, 1e-6) << gspo[0].dump();

  // Rewards a program checks, no reward model (GRPO; PPO's critic then starts from the actor's folder):
  // format (a pattern every text matches) 0.5, DAPO's overlong penalty over the whole 12-token budget
  // (−L/12), exact answers 2. The held-out reward is that sum of the greedy answers' figures.
  const std::string program = "rewards = [\"format\", \"overlong\", \"exact_answer\"]\nreward_weights = [0.5, 1.0, 2.0]\n"
                              "format_pattern = \"[\\\\s\\\\S]*\"\noverlong_buffer = 12\nanswer_pattern = \"^([\\\\s\\\\S]*)$\"\n";
  const std::vector<nlohmann::json> verified = train_stage(root_, "grpo", "grpo_verified", rl_config(root_, "grpo_verified_run", 1,
      "prompts_per_rollout = 2\ngroup_size = 4\nkl_coef = 0.0\n" + program, /*reward_model=*/""));
  ASSERT_EQ(verified.size(), 1u);
  EXPECT_LT(std::abs(verified[0]["loss"].get<double>()), 1e-6) << verified[0].dump();
  const testing::CommandResult scored =
      chat("grpo eval --config " + (root_ / "grpo_verified.toml").string() + " --checkpoint init");
  ASSERT_EQ(scored.exit_code, 0) << scored.output;
  const nlohmann::json line = testing::last_json_line(scored.output);
  EXPECT_NEAR(line["val_reward"].get<double>(),
              0.5 - line["val_length"].get<double>() / 12 + 2 * line["val_exact_match"].get<double>(), 1e-9) << line.dump();
  const std::vector<nlohmann::json> ppo_verified = train_stage(root_, "ppo", "ppo_verified", rl_config(root_, "ppo_verified_run", 1,
      "prompts_per_rollout = 8\n" + program, /*reward_model=*/""));
  ASSERT_EQ(ppo_verified.size(), 1u);
  EXPECT_NEAR(ppo_verified[0]["ratio"].get<double>(), 1.0, 1e-5) << "the critic from the actor's folder, the actor on-policy";

  const testing::CommandResult answered = chat("chat --model " + (root_ / "ppo_hf").string() + " --prompt 'What does w3 mean?'");
  EXPECT_EQ(answered.exit_code, 0) << answered.output;
}

// LoRA on the family's projections (GPT-2's fused c_attn, a Conv1D whose weight is [in, out]; Llama's
// q_proj, v_proj and gate_proj): the merged export is the family's causal LM with the adapted model's
// outputs, and the adapter folder (fan_in_fan_out for Conv1D, as PEFT keeps it) on the transformers start
// gives the same outputs in PEFT.
// The family's models under the sharded strategies: SFT's policy (from the start folder), the reward model
// (from the SFT folder) and DPO's policy (its reference frozen beside it) are left described, and ZeRO-2 or
// Gemini fill their chunks from the folder; each of two steps has the plain run's loss and gradient norm
// (float32, the same sums in chunk order: 1e-5 relative).
TYPED_TEST(ChatFoldersTest, SftRewardModelAndDpoUnderZeroAndGeminiTakeThePlainSteps) {
  const fs::path& root_ = this->root_;
  ASSERT_EQ(this->rm_exported_.exit_code, 0) << this->rm_exported_.output;
  const std::string instructions = "train = \"" + (root_ / "train.jsonl").string() + "\"\nval = \"" + (root_ / "val.jsonl").string() + "\"\n";
  const std::string pairs =
      "train = \"" + (root_ / "train_pairs.jsonl").string() + "\"\nval = \"" + (root_ / "val_pairs.jsonl").string() + "\"\n";
  struct Stage {
    std::string name, data, from;
  };
  for (const Stage& stage : {Stage{"sft", instructions, this->start_dir().string()}, Stage{"rm", pairs, (root_ / "sft_hf").string()},
                             Stage{"dpo", pairs, (root_ / "sft_hf").string()}}) {
    const auto steps = [&](const std::string& strategy) {
      const std::string name = stage.name + "_steps_" + strategy;
      return train_stage(root_, stage.name, name, common_config(root_, name + "_run", 2, stage.data) + "[model]\ninit_from = \"" +
                                                      stage.from + "\"\n[optim]\nlr = 1e-3\nwarmup_steps = 1\n[memory]\nstrategy = \"" +
                                                      strategy + "\"\n");
    };
    const std::vector<nlohmann::json> plain = steps("none");
    ASSERT_EQ(plain.size(), 2u) << stage.name;
    EXPECT_GT(plain[1]["grad_norm"].get<double>(), 0.0) << stage.name;
    for (const std::string strategy : {"zero2", "gemini"}) expect_same_steps(steps(strategy), plain, 1e-5, stage.name + " " + strategy);
  }
}

// SFT of the family's folder under every sequence-parallel mode on two ranks (each rank its half of every
// 64-token row; Llama's rotary angles are the whole row's, cut as the stream is) takes the plain run's two
// steps (float32, the attention summed in another order: 1e-5 relative).
TYPED_TEST(ChatFoldersTest, SftUnderSequenceParallelismTakesThePlainSteps) {
  const fs::path& root_ = this->root_;
  const std::string config = "[model]\ninit_from = \"" + this->start_dir().string() + "\"\n[optim]\nlr = 1e-3\nwarmup_steps = 1\n";
  const auto steps = [&](const std::string& mode) {
    const std::string name = "sft_sequence_" + mode;
    const std::string data = "train = \"" + (root_ / "train.jsonl").string() + "\"\nval = \"" + (root_ / "val.jsonl").string() + "\"\n";
    const std::string parallel = mode == "none" ? "" : "[parallel.sequence]\nmode = \"" + mode + "\"\nsize = 2\n";
    return train_stage(root_, "sft", name, common_config(root_, name + "_run", 2, data) + config + parallel, "", mode == "none" ? 1 : 2);
  };
  const std::vector<nlohmann::json> plain = steps("none");
  ASSERT_EQ(plain.size(), 2u);
  for (const std::string mode : {"ring", "ring_scores", "all_to_all"}) expect_same_steps(steps(mode), plain, 1e-5, "sft " + mode);
}

// SFT of the family's folder under every tensor-parallel mode (1D on two ranks, 2D on four, 2.5D and 3D on
// eight; Llama's RMSNorms cut with the stream's features in 2D, 2.5D and 3D, its per-head norms shared by
// every rank), under two pipeline stages, and packed rows under 2D, take the plain run's two steps (float32,
// the products summed in other orders: 1e-5 relative).
TYPED_TEST(ChatFoldersTest, SftUnderTensorAndPipelineParallelismTakesThePlainSteps) {
  const fs::path& root_ = this->root_;
  const std::string config = "[model]\ninit_from = \"" + this->start_dir().string() + "\"\n[optim]\nlr = 1e-3\nwarmup_steps = 1\n";
  struct Mode {
    std::string name, keys;
    int ranks;
  };
  const auto steps = [&](const Mode& mode, const std::string& args = "") {
    const std::string name = "sft_tensor_" + mode.name;
    const std::string data = "train = \"" + (root_ / "train.jsonl").string() + "\"\nval = \"" + (root_ / "val.jsonl").string() + "\"\n";
    return train_stage(root_, "sft", name, common_config(root_, name + "_run", 2, data) + config + mode.keys, args, mode.ranks);
  };
  const std::vector<nlohmann::json> plain = steps({"none", "", 1});
  ASSERT_EQ(plain.size(), 2u);
  const Mode grid{"2d", "[parallel.tensor]\nmode = \"2d\"\nsize = 4\n", 4};
  for (const Mode& mode : {Mode{"1d", "[parallel.tensor]\nmode = \"1d\"\nsize = 2\n", 2}, grid,
                           Mode{"2.5d", "[parallel.tensor]\nmode = \"2.5d\"\nsize = 8\ndepth = 2\n", 8},
                           Mode{"3d", "[parallel.tensor]\nmode = \"3d\"\nsize = 8\n", 8},
                           Mode{"pipeline", "[parallel]\npipeline = 2\n", 2}})
    expect_same_steps(steps(mode), plain, 1e-5, "sft " + mode.name);
  // Packed rows (several examples a row, each attending to itself): the documents are cut with the rows.
  const std::string packed = "--set data.pack=true";
  const std::vector<nlohmann::json> plain_packed = steps({"none_packed", "", 1}, packed);
  expect_same_steps(steps({"2d_packed", grid.keys, grid.ranks}, packed), plain_packed, 1e-5, "sft 2d packed");
}

TYPED_TEST(ChatFoldersTest, LoraExportsMergedAndPeftAdapters) {
  using Folders = TypeParam;
  const fs::path& root_ = this->root_;
  const testing::PythonRun& start_ = this->start_;
  ASSERT_EQ(start_.exit_code, 0) << start_.output;
  const fs::path sft = write_config(root_, "lora", common_config(root_, "lora_run", 3,
      "train = \"" + (root_ / "train.jsonl").string() + "\"\nval = \"" + (root_ / "val.jsonl").string() + "\"\n") +
      "[model]\ninit_from = \"" + this->start_dir().string() + "\"\n[optim]\nlr = 1e-2\nwarmup_steps = 0\n"
      "[lora]\nrank = 4\nalpha = 8.0\ntargets = " + Folders::kLoraTargets + "\n");
  const testing::CommandResult trained = chat("sft --config " + sft.string());
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  // The folder gives the whole shape: an OPT shape key beside it is refused by name.
  const testing::CommandResult reshaped = chat("sft --config " + sft.string() + " --set model.hidden_size=64");
  EXPECT_EQ(reshaped.exit_code, 1);
  EXPECT_TRUE(testing::Contains(reshaped.output, "model.hidden_size")) << reshaped.output;
  EXPECT_TRUE(testing::Contains(reshaped.output, std::string("is a ") + Folders::kFamily + " folder")) << reshaped.output;
  const testing::CommandResult merged = chat("sft export --config " + sft.string() + " --out " + (root_ / "lora_hf").string());
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  const testing::CommandResult adapter =
      chat("sft export --adapter --config " + sft.string() + " --out " + (root_ / "lora_adapter").string());
  ASSERT_EQ(adapter.exit_code, 0) << adapter.output;
  const nlohmann::json adapter_config = nlohmann::json::parse(read_file((root_ / "lora_adapter/adapter_config.json").string()));
  EXPECT_EQ(adapter_config["fan_in_fan_out"], Folders::kFanInFanOut);
  const fs::path expected = kuafu_logprobs(root_ / "lora_hf", Folders::kFamily);
  expect_reference_agrees("check_lm " + (root_ / "lora_hf").string() + " " + expected.string(), Folders::kCausalLM);
  expect_reference_agrees("check_peft " + this->start_dir().string() + " " + (root_ / "lora_adapter").string() + " " +
                              expected.string(),
                          "PeftModelForCausalLM");
  // The adapters moved the model: the merged export is not the start.
  const fs::path start = kuafu_logprobs(this->start_dir(), Folders::kFamily);
  const io::SafetensorsFile before = io::load_safetensors(start.string()), after = io::load_safetensors(expected.string());
  EXPECT_GT((*before.find("lm_logprobs") - *after.find("lm_logprobs")).abs().max().item<double>(), 1e-4);
}

}  // namespace
}  // namespace kuafu::chat
