// The reward / value model and the policy against transformers (tests/python/rlhf_models_reference.py),
// for each family (OPT and GPT-2): a ...ForSequenceClassification folder loads and scores as
// transformers scores it, left- or right-padded; what Kuafu writes loads back in transformers with
// Kuafu's scores; a causal model's next-token log-probabilities equal transformers'. Float32, 1e-5: the
// two libraries' kernels differ in summation order by ~1e-6 on these sizes. And PPO's experience does not
// depend on where padding sits (float64, 1e-12: the same sums in another order).
#include <gtest/gtest.h>

#include "apps/chat_rlhf/experience.h"
#include "apps/chat_rlhf/policy.h"
#include "apps/chat_rlhf/scored_model.h"
#include "apps/opt_finetune/hugging_face.h"
#include "core/train/lazy_model.h"
#include "tests/support/reference_outputs.h"
#include "tests/support/same_parameters.h"

namespace kuafu::chat {
namespace {

constexpr double kModelTolerance = 1e-5;

const testing::Reference& reference() {
  static const testing::Reference r = testing::build_reference("rlhf_models_reference.py", "rlhf_models");
  return r;
}

double difference(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

// The reference's models and figures of one family: "lm", "rm" and their outputs under the prefix
// ("" for OPT, "gpt2_" for GPT-2).
class ChatModelsTest : public ::testing::TestWithParam<std::string> {
 protected:
  const testing::Reference& ref = reference();
  std::string folder(const std::string& model) const { return (ref.dir / (GetParam() + model)).string(); }
  torch::Tensor figure(const std::string& name) const { return ref[GetParam() + name]; }
};

TEST_P(ChatModelsTest, RewardModelScoresAsTransformersLeftOrRightPadded) {
  ScoredModel model = load_scored_model(folder("rm"));
  model->eval();
  torch::NoGradGuard no_grad;
  for (const std::string side : {"left", "right"}) {
    const torch::Tensor scores = model->scores(ref[side + "_ids"], ref[side + "_mask"].to(torch::kBool));
    EXPECT_LT(difference(scores, figure(side + "_scores")), kModelTolerance) << side;
  }
}

// In bf16 (the precision RLHF runs in on GPUs) the padded rows score as in float32, to bf16's
// resolution: 8 bits of mantissa over two layers leave the scores within 0.05 of float32's.
TEST_P(ChatModelsTest, RewardModelScoresPaddedRowsInBf16) {
  ScoredModel model = load_scored_model(folder("rm"));
  model->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor real = ref["left_mask"].to(torch::kBool);
  const torch::Tensor full = model->scores(ref["left_ids"], real);
  model->to(torch::kBFloat16);
  const torch::Tensor half = model->scores(ref["left_ids"], real).to(torch::kFloat32);
  EXPECT_LT(difference(half, full), 0.05);
}

TEST_P(ChatModelsTest, ExportedRewardModelLoadsInTransformersWithKuafusScores) {
  ScoredModel model = load_scored_model(folder("rm"));
  {
    torch::NoGradGuard no_grad;
    model->score->weight.mul_(-2.0);  // Kuafu's own weights, not the folder's
  }
  const auto out = testing::temp_dir(GetParam() + "rm_export");
  std::filesystem::remove_all(out);
  save_scored_model(model, out.string());
  model->eval();
  torch::NoGradGuard no_grad;
  io::NamedTensors expected;
  for (const std::string side : {"left", "right"}) {
    expected.emplace_back(side + "_ids", ref[side + "_ids"]);
    expected.emplace_back(side + "_mask", ref[side + "_mask"]);
    expected.emplace_back(side + "_scores", model->scores(ref[side + "_ids"], ref[side + "_mask"].to(torch::kBool)));
  }
  const std::string expected_path = (out.parent_path() / (out.filename().string() + "_expected.safetensors")).string();
  io::save_safetensors(expected_path, expected);
  const testing::PythonRun run = testing::run_python_reference("rlhf_models_reference.py", "check_rm " + out.string() + " " + expected_path);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json line = testing::last_json_line(run.output);
  EXPECT_EQ(line["architecture"], GetParam().empty() ? "OPTForSequenceClassification" : "GPT2ForSequenceClassification");
  EXPECT_LT(line["max_difference"].get<double>(), kModelTolerance);
}

// A frozen model is made straight in its compute dtype: its weights are the folder's rounded to bf16,
// exactly what the float32 model cast afterwards holds.
TEST_P(ChatModelsTest, FrozenModelsLoadStraightInTheirComputeDtype) {
  nn::CausalLMPtr lm = opt::load_causal_lm(folder("lm"), torch::kCPU, torch::kBFloat16);
  testing::expect_same_parameters(lm->module(), opt::load_causal_lm(folder("lm"))->module(), torch::kBFloat16);
  ScoredModel reward = load_scored_model(folder("rm"), torch::kCPU, torch::kBFloat16);
  testing::expect_same_parameters(*reward, *load_scored_model(folder("rm")), torch::kBFloat16);
}

// A reward or value model described on the meta device, given storage and initialised from a seed is
// the one made on the CPU from that seed (trunk, then head), bit for bit: PPO's benchmark makes its
// critic so, or leaves it described for a sharded strategy to draw into its chunks.
TEST_P(ChatModelsTest, ADescribedScoredModelDrawsAsAnEagerOne) {
  const opt::LmShape shape = opt::shape_of(*opt::load_causal_lm(folder("lm")));
  torch::manual_seed(4);
  ScoredModel eager(shape);
  ScoredModel lazy(shape, parallel::ModelOptions::serial_on(torch::kMeta));
  for (const auto& p : lazy->parameters()) ASSERT_TRUE(p.is_meta());
  train::materialize(*lazy, train::Materialization::all_in(torch::kCPU, torch::kFloat32));
  torch::manual_seed(4);
  lazy->initialize();
  testing::expect_same_parameters(*lazy, *eager);
}

TEST_P(ChatModelsTest, RewardModelStartsFromACausalModelsTrunk) {
  nn::CausalLMPtr lm = opt::load_causal_lm(folder("lm"));
  ScoredModel model(opt::shape_of(*lm));
  const torch::Tensor head = model->score->weight.clone();
  EXPECT_FALSE(load_scored_weights(model, folder("lm")));
  const std::string block = GetParam().empty() ? "model.decoder.layers.1.fc2.bias" : "transformer.h.1.mlp.c_proj.bias";
  EXPECT_TRUE(model->named_parameters()[block].equal(lm->module().named_parameters()[block]));
  EXPECT_TRUE(model->score->weight.equal(head)) << "the head is new: it keeps its initial values";
}

TEST_P(ChatModelsTest, PolicyLogprobsEqualTransformers) {
  nn::CausalLMPtr lm = opt::load_causal_lm(folder("lm"));
  lm->module().eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor real = ref["left_mask"].to(torch::kBool);
  const torch::Tensor logprobs = next_token_logprobs(*lm, ref["left_ids"], real);
  // Positions whose token and next token are both real (a left pad predicts nothing anyone reads).
  const torch::Tensor next_real = real.narrow(1, 1, real.size(1) - 1) & real.narrow(1, 0, real.size(1) - 1);
  EXPECT_LT(difference(logprobs.index({next_real}), figure("lm_logprobs").index({next_real})), kModelTolerance);
}

// The trap: the same prompts and responses laid out left-padded (as generated) and right-padded give the
// same log-probabilities, values, scores, rewards and advantages, at float64 rounding.
TEST_P(ChatModelsTest, ExperienceIsTheSameLeftOrRightPadded) {
  nn::CausalLMPtr policy = opt::load_causal_lm(folder("lm"));
  ScoredModel reward = load_scored_model(folder("rm"));
  nn::CausalLMPtr reference_model = opt::shape_of(*policy).build();
  ScoredModel critic(opt::shape_of(*policy));
  for (torch::nn::Module* m : {&policy->module(), static_cast<torch::nn::Module*>(reward.get()), &reference_model->module(),
                               static_cast<torch::nn::Module*>(critic.get())}) {
    m->to(torch::kFloat64);
    m->eval();
  }
  const std::vector<std::vector<int64_t>> prompts = {{2, 5, 6, 7}, {2, 11}, {2, 20, 21}};
  const std::vector<std::vector<int64_t>> responses = {{30, 31, 2}, {40, 41, 42, 43, 44}, {50}};  // ended, cut, cut
  ExperienceSettings settings;
  settings.missing_eos_penalty = -0.5;
  settings.bootstrap_truncated = true;  // the cut response's bootstrap must not depend on the padding either
  const Experience left = make_experience(make_sequences(prompts, responses, 1, {2}, torch::kCPU), *policy, *reference_model,
                                          critic, reward, settings);
  const Experience right = make_experience(make_sequences(prompts, responses, 1, {2}, torch::kCPU, /*right_padded=*/true),
                                           *policy, *reference_model, critic, reward, settings);
  EXPECT_FALSE(left.sequences.tokens.sizes() == right.sequences.tokens.sizes() && left.sequences.tokens.equal(right.sequences.tokens));
  EXPECT_TRUE(left.mask.equal(right.mask));
  for (const auto& [name, a, b] : std::vector<std::tuple<std::string, torch::Tensor, torch::Tensor>>{
           {"logprobs", left.logprobs, right.logprobs}, {"ref_logprobs", left.ref_logprobs, right.ref_logprobs},
           {"values", left.values, right.values}, {"bootstrap", left.bootstrap, right.bootstrap},
           {"scores", left.scores, right.scores}, {"rewards", left.rewards, right.rewards},
           {"advantages", left.advantages, right.advantages}, {"returns", left.returns, right.returns}}) {
    EXPECT_LT(difference(a, b), 1e-12) << name;
  }
  EXPECT_TRUE(left.bootstrap[0].item<double>() == 0 && left.bootstrap[1].item<double>() != 0)
      << "a response that ended is not bootstrapped; a cut one is";
  torch::NoGradGuard no_grad;
  const torch::Tensor raw = sequence_scores(reward, left.sequences);
  EXPECT_NEAR(left.scores[0].item<double>(), raw[0].item<double>(), 1e-12) << "ended: no penalty";
  EXPECT_NEAR(left.scores[1].item<double>(), raw[1].item<double>() - 0.5, 1e-12) << "cut at the limit: the penalty";
}

// The trap of a padding id equal to EOS (GPT-2's tokenizers; OPT's without "<pad>"): every mask is
// positional, so padding with the EOS id hides no real EOS: the same experience as with another padding
// id, responses that ended counted as ended, the score on their EOS.
TEST_P(ChatModelsTest, PaddingWithTheEosIdHidesNoEos) {
  nn::CausalLMPtr policy = opt::load_causal_lm(folder("lm"));
  ScoredModel reward = load_scored_model(folder("rm"));
  ScoredModel critic(opt::shape_of(*policy));
  for (torch::nn::Module* m : {&policy->module(), static_cast<torch::nn::Module*>(reward.get()),
                               static_cast<torch::nn::Module*>(critic.get())}) {
    m->to(torch::kFloat64);
    m->eval();
  }
  const int64_t eos = 2;
  const std::vector<std::vector<int64_t>> prompts = {{2, 5, 6}, {2, 11, 12, 13}};
  const std::vector<std::vector<int64_t>> responses = {{30, eos}, {40, 41, 42, 43, eos}};
  const Experience with_pad = make_experience(make_sequences(prompts, responses, 1, {eos}, torch::kCPU), *policy, *policy,
                                              critic, reward, {});
  const Experience with_eos = make_experience(make_sequences(prompts, responses, eos, {eos}, torch::kCPU), *policy, *policy,
                                              critic, reward, {});
  EXPECT_TRUE(with_eos.sequences.ended.all().item<bool>());
  EXPECT_TRUE(with_eos.mask.sum(1).equal(torch::tensor({2, 5})));
  EXPECT_LT(difference(with_eos.scores, with_pad.scores), 1e-12);
  EXPECT_LT(difference(with_eos.advantages, with_pad.advantages), 1e-12);
}

// A response ended when its last token is any of the stop tokens (a template's end of turn and
// generation_config.json's other EOS ids); one that stops elsewhere was cut by the length limit, whatever
// stop tokens it holds before its end.
TEST(ExperienceTest, AResponseEndsAtAnyOfItsStopTokens) {
  const std::vector<std::vector<int64_t>> prompts = {{5}, {5, 6}, {5}, {7}};
  const std::vector<std::vector<int64_t>> responses = {{30, 2}, {40, 9}, {9, 2, 50}, {60}};
  const Sequences s = make_sequences(prompts, responses, 1, {2, 9}, torch::kCPU);
  EXPECT_TRUE(s.ended.equal(torch::tensor({true, true, false, false})));
  EXPECT_FALSE(make_sequences(prompts, responses, 1, {}, torch::kCPU).ended.any().item<bool>());
}

INSTANTIATE_TEST_SUITE_P(Families, ChatModelsTest, ::testing::Values("", "gpt2_"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param.empty() ? "OPT" : "GPT2"; });

// A PPO update on a fixed experience batch, through the app's functions (the actor's and the critic's
// passes over rows with left-padded prompts and right-padded responses, clipped policy and value losses,
// token means), equals the papers' formulas transcribed token by token in plain PyTorch on transformers'
// models: both losses, and the gradients of the actor's and the critic's parameters. Float32, 1e-5
// relative: the libraries sum in other orders.
TEST(ChatModelsOptTest, PpoUpdateEqualsThePythonTranscription) {
  const testing::Reference& ref = reference();
  opt::OPTForCausalLM actor = opt::opt_format().load((ref.dir / "lm").string());
  ScoredModel critic = load_scored_model((ref.dir / "rm").string());
  actor->eval();
  critic->eval();
  const std::vector<std::vector<int64_t>> prompts = {{2, 5, 6, 7}, {2, 11}, {2, 20, 21}};
  const std::vector<std::vector<int64_t>> responses = {{30, 31, 2}, {40, 41, 42, 43, 44}, {50, 2}};
  const Sequences s = make_sequences(prompts, responses, 1, {2}, torch::kCPU);
  torch::manual_seed(11);
  const torch::Tensor mask = s.response_mask();
  const auto shape = mask.sizes();
  torch::Tensor old_logprobs, old_values;
  {
    torch::NoGradGuard no_grad;  // near the current policy, so some ratios clip and some do not
    old_logprobs = (response_logprobs(*actor, s, {}) + 0.3 * torch::randn(shape)) * mask;
    old_values = (response_values(critic, s).values + 0.3 * torch::randn(shape)) * mask;
  }
  const torch::Tensor advantages = torch::randn(shape) * mask, returns = torch::randn(shape) * mask;
  const double clip = 0.2, value_clip = 0.2;
  const BatchCounts counts = counts_of(mask);
  const torch::Tensor policy_loss = aggregate(
      clipped_policy_loss(response_logprobs(*actor, s, {}), old_logprobs, advantages, clip, clip).loss, mask, Aggregation::TokenMean, counts);
  const torch::Tensor value_loss =
      aggregate(clipped_value_loss(response_values(critic, s).values, old_values, returns, value_clip), mask, Aggregation::TokenMean, counts);
  (policy_loss + value_loss).backward();

  const auto dir = testing::temp_dir("ppo_update");
  io::save_safetensors((dir / "in.safetensors").string(),
                       {{"tokens", s.tokens}, {"real", s.real.to(torch::kInt64)}, {"response_start", s.response_start},
                        {"response_length", s.response_length}, {"old_logprobs", old_logprobs}, {"old_values", old_values},
                        {"advantages", advantages}, {"returns", returns}, {"clip", torch::tensor(clip)},
                        {"value_clip", torch::tensor(value_clip)}});
  const testing::PythonRun run = testing::run_python_reference(
      "rlhf_models_reference.py", "ppo_update " + ref.dir.string() + " " + (dir / "in.safetensors").string() + " " +
                                      (dir / "out.safetensors").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const testing::ReferenceOutputs out = testing::read_reference(dir / "out.safetensors");
  EXPECT_NEAR(policy_loss.item<double>(), out["policy_loss"].item<double>(), 1e-5);
  EXPECT_NEAR(value_loss.item<double>(), out["value_loss"].item<double>(), 1e-5);
  int compared = 0;
  for (const auto& [prefix, module] : {std::pair<std::string, torch::nn::Module*>{"actor.", actor.get()}, {"critic.", critic.get()}}) {
    for (const auto& item : module->named_parameters()) {
      const torch::Tensor* expected = out.file.find(prefix + item.key());
      if (!expected) continue;
      const torch::Tensor grad = item.value().grad().to(torch::kFloat64);
      EXPECT_LT((grad - *expected).abs().max().item<double>(), 1e-5 * std::max(1.0, expected->abs().max().item<double>()))
          << prefix << item.key();
      ++compared;
    }
  }
  EXPECT_GE(compared, 6) << "the reference names fc2, embed_positions and score gradients of both models";
}

}  // namespace
}  // namespace kuafu::chat
