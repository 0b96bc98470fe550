// The numerics of RLHF (apps/chat_rlhf/{advantages,policy_losses,preference_losses}) against
// tests/python/rlhf_reference.py: trl's and transformers' standalone functions where they exist, and
// otherwise the published formulas transcribed row by row. Float64 throughout; the tolerance, 1e-9, is
// far above float64 rounding (sums of ~30 terms, ~1e-15) and far below any formula error.
#include <gtest/gtest.h>

#include <map>

#include "apps/chat_rlhf/advantages.h"
#include "apps/chat_rlhf/policy_losses.h"
#include "apps/chat_rlhf/preference_losses.h"
#include "core/io/safetensors.h"
#include "tests/support/reference_outputs.h"

namespace kuafu::chat {
namespace {

constexpr double kMathTolerance = 1e-9;
const auto kF64 = torch::TensorOptions(torch::kFloat64);

double max_difference(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

torch::Tensor scalar(double v) { return torch::tensor(v, kF64); }

// Right-padded response masks of the given lengths, [B, R].
torch::Tensor lengths_mask(const std::vector<int64_t>& lengths, int64_t columns) {
  return torch::arange(columns).unsqueeze(0) < torch::tensor(lengths).unsqueeze(1);
}

TEST(RlMathTest, EveryQuantityEqualsTheReference) {
  torch::manual_seed(7);
  const int64_t rows = 4, length = 6;
  const torch::Tensor mask = lengths_mask({6, 3, 1, 4}, length);
  const double temperature = 0.7, gamma = 0.9, lambda = 0.8, kl_coef = 0.1, clip_low = 0.2, clip_high = 0.28,
               value_clip = 0.2, beta = 0.1, margin = 0.5;
  const int64_t max_length = 8, group_size = 3;
  std::map<std::string, torch::Tensor> in = {
      {"logits", torch::randn({3, 5, 11}, kF64) * 2}, {"tokens", torch::randint(0, 11, {3, 5})},
      {"logp", -torch::rand({rows, length}, kF64) * 3}, {"ref_logp", -torch::rand({rows, length}, kF64) * 3},
      {"old_logp", -torch::rand({rows, length}, kF64) * 3}, {"score", torch::randn({rows}, kF64)},
      {"values", torch::randn({rows, length}, kF64)}, {"bootstrap", torch::tensor({0.0, 0.7, 0.0, -0.4}, kF64)},
      {"adv", torch::randn({rows, length}, kF64)}, {"v", torch::randn({rows, length}, kF64)},
      {"old_v", torch::randn({rows, length}, kF64)}, {"ret", torch::randn({rows, length}, kF64)},
      {"grpo_rewards", torch::randn({6}, kF64)}, {"pc", -torch::rand({5}, kF64) * 9}, {"pr", -torch::rand({5}, kF64) * 9},
      {"rc", -torch::rand({5}, kF64) * 9}, {"rr", -torch::rand({5}, kF64) * 9}, {"chosen", torch::randn({5}, kF64)},
      {"rejected", torch::randn({5}, kF64)}, {"mask", mask.to(torch::kInt64)},
      {"nc", torch::tensor({3.0, 1.0, 7.0, 2.0, 5.0}, kF64)}, {"nr", torch::tensor({4.0, 6.0, 1.0, 2.0, 9.0}, kF64)},
      {"score_batch0", torch::randn({6}, kF64) * 3 + 1}, {"score_batch1", torch::randn({4}, kF64) * 2 - 2},
      {"score_batch2", torch::randn({5}, kF64) * 5}, {"score_clip", scalar(1.5)},
      {"temperature", scalar(temperature)}, {"gamma", scalar(gamma)}, {"lambda", scalar(lambda)},
      {"kl_coef", scalar(kl_coef)}, {"clip_low", scalar(clip_low)}, {"clip_high", scalar(clip_high)},
      {"value_clip", scalar(value_clip)}, {"beta", scalar(beta)}, {"margin", scalar(margin)},
      {"max_length", scalar(static_cast<double>(max_length))}, {"group_size", scalar(static_cast<double>(group_size))}};
  in["top_tokens"] = in.at("logits").argmax(-1);
  const auto dir = testing::temp_dir("rl_math");
  io::save_safetensors((dir / "in.safetensors").string(), io::NamedTensors(in.begin(), in.end()));
  const testing::PythonRun run = testing::run_python_reference(
      "rlhf_reference.py", "losses " + (dir / "in.safetensors").string() + " " + (dir / "out.safetensors").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const testing::ReferenceOutputs ref = testing::read_reference(dir / "out.safetensors");
  auto t = [&](const std::string& name) { return in.at(name); };

  EXPECT_LT(max_difference(sampled_logprobs(t("logits"), t("tokens"), temperature), ref["logprobs"]), kMathTolerance);
  // The most likely tokens, which every filter keeps.
  EXPECT_LT(max_difference(sampled_logprobs(t("logits"), t("top_tokens"), temperature, 4, 0.9), ref["logprobs_topk"]), kMathTolerance);
  EXPECT_LT(max_difference(entropy(t("logits"), temperature), ref["entropy"]), kMathTolerance);

  const torch::Tensor logp = t("logp"), ref_logp = t("ref_logp");
  EXPECT_LT(max_difference(kl_estimate(logp, ref_logp, KlEstimator::K1), ref["k1"]), kMathTolerance);
  EXPECT_LT(max_difference(kl_estimate(logp, ref_logp, KlEstimator::K2), ref["k2"]), kMathTolerance);
  EXPECT_LT(max_difference(kl_estimate(logp, ref_logp, KlEstimator::K3), ref["k3"]), kMathTolerance);

  const torch::Tensor rewards = token_rewards(t("score"), kl_estimate(logp, ref_logp, KlEstimator::K1), mask, kl_coef);
  EXPECT_LT(max_difference(rewards, ref["token_rewards"]), kMathTolerance);
  const Advantages a = gae(rewards, t("values"), mask, t("bootstrap"), gamma, lambda);
  EXPECT_LT(max_difference(a.advantages, ref["advantages"]), kMathTolerance);
  EXPECT_LT(max_difference(a.returns, ref["returns"]), kMathTolerance);
  EXPECT_LT(max_difference(whiten(a.advantages, mask), ref["whitened"]), kMathTolerance);

  const PolicyTerms policy = clipped_policy_loss(logp, t("old_logp"), t("adv"), clip_low, clip_high);
  EXPECT_LT(max_difference(policy.loss, ref["policy_loss"]), kMathTolerance);
  EXPECT_TRUE(policy.clipped.to(torch::kFloat64).equal(ref["policy_clipped"]));
  EXPECT_LT(max_difference(clipped_value_loss(t("v"), t("old_v"), t("ret"), value_clip), ref["value_loss"]), kMathTolerance);
  // GSPO: one ratio per response from its real tokens' mean log-ratio; its loss at real tokens and the gradient
  // of the sequence-mean loss (padding's log-probabilities, random here, must not move it).
  const torch::Tensor leaf = logp.detach().clone().requires_grad_();
  const PolicyTerms gspo = clipped_policy_loss(leaf, t("old_logp"), t("adv"), clip_low, clip_high, mask, ImportanceLevel::Sequence);
  EXPECT_LT(max_difference(gspo.loss.detach() * mask, ref["gspo_loss"] * mask), kMathTolerance);
  aggregate(gspo.loss, mask, Aggregation::SequenceMean, counts_of(mask)).backward();
  EXPECT_LT(max_difference(leaf.grad(), ref["gspo_grad"]), kMathTolerance);
  EXPECT_GT(max_difference(gspo.loss.detach() * mask, policy.loss * mask), 1e-3) << "the sequence ratio is not the token one";

  const BatchCounts whole = counts_of(mask, max_length);
  EXPECT_LT(max_difference(aggregate(policy.loss, mask, Aggregation::TokenMean, whole), ref["token_mean"]), kMathTolerance);
  EXPECT_LT(max_difference(aggregate(policy.loss, mask, Aggregation::SequenceMean, whole), ref["sequence_mean"]), kMathTolerance);
  EXPECT_LT(max_difference(aggregate(policy.loss, mask, Aggregation::Constant, whole), ref["constant"]), kMathTolerance);

  const torch::Tensor grpo = t("grpo_rewards");
  EXPECT_LT(max_difference(group_advantages(grpo, group_size, RewardScaling::Group), ref["grpo_group"]), kMathTolerance);
  EXPECT_LT(max_difference(group_advantages(grpo, group_size, RewardScaling::Batch), ref["grpo_batch"]), kMathTolerance);
  EXPECT_LT(max_difference(group_advantages(grpo, group_size, RewardScaling::None), ref["grpo_none"]), kMathTolerance);

  EXPECT_LT(max_difference(dpo_loss(t("pc"), t("pr"), t("rc"), t("rr"), beta), ref["dpo"]), kMathTolerance);
  EXPECT_LT(max_difference(dpo_loss(t("pc"), t("pr"), t("rc"), t("rr"), beta, PreferenceLoss::Ipo), ref["ipo"]), kMathTolerance);
  EXPECT_LT(max_difference(dpo_loss(t("pc"), t("pr"), t("rc"), t("rr"), beta, PreferenceLoss::Ipo, t("nc"), t("nr")),
                           ref["ipo_per_token"]), kMathTolerance);
  EXPECT_LT(max_difference(pairwise_loss(t("chosen"), t("rejected"), margin), ref["pairwise"]), kMathTolerance);

  RunningMoments by_std, by_mean_std;
  for (int b = 0; b < 3; ++b) {
    const std::string batch = "score_batch" + std::to_string(b), n = std::to_string(b);
    by_std.update(t(batch));
    by_mean_std.update(t(batch));
    EXPECT_LT(max_difference(scale_scores(t(batch), &by_std, false, 0), ref["score_std_scaled" + n]), kMathTolerance) << b;
    EXPECT_LT(max_difference(scale_scores(t(batch), &by_mean_std, true, 1.5), ref["score_norm_clipped" + n]), kMathTolerance) << b;
  }
}

// Two micro-batches of different lengths, each aggregated as a share of the whole batch, sum to the
// loss of both taken at once, for every aggregation; the per-micro-batch mean x₁/n₁ + x₂/n₂ does not.
TEST(RlMathTest, MicroBatchSharesSumToTheWholeBatchLoss) {
  torch::manual_seed(3);
  const torch::Tensor per_token = torch::randn({5, 7}, kF64);
  const torch::Tensor mask = lengths_mask({7, 1, 2, 6, 5}, 7);
  const BatchCounts whole = counts_of(mask, 9);
  for (const Aggregation aggregation : {Aggregation::TokenMean, Aggregation::SequenceMean, Aggregation::Constant}) {
    const torch::Tensor at_once = aggregate(per_token, mask, aggregation, whole);
    const torch::Tensor shares = aggregate(per_token.narrow(0, 0, 2), mask.narrow(0, 0, 2), aggregation, whole) +
                                 aggregate(per_token.narrow(0, 2, 3), mask.narrow(0, 2, 3), aggregation, whole);
    EXPECT_NEAR(shares.item<double>(), at_once.item<double>(), 1e-12);
  }
  const torch::Tensor naive = aggregate(per_token.narrow(0, 0, 2), mask.narrow(0, 0, 2), Aggregation::TokenMean,
                                        counts_of(mask.narrow(0, 0, 2))) +
                              aggregate(per_token.narrow(0, 2, 3), mask.narrow(0, 2, 3), Aggregation::TokenMean,
                                        counts_of(mask.narrow(0, 2, 3)));
  EXPECT_GT(std::abs(naive.item<double>() / 2 - aggregate(per_token, mask, Aggregation::TokenMean, whole).item<double>()), 1e-3)
      << "the test's lengths must make the naive mean differ";
}

// The score lands on the last real token only: not on every token, not on the padding after EOS, also
// when the padding id equals EOS's (the mask is positional, ids play no part), and nowhere for an empty
// response. Worked by hand.
TEST(RlMathTest, TheScoreLandsOnTheLastRealTokenOnly) {
  const torch::Tensor mask = lengths_mask({3, 1, 0}, 4);
  const torch::Tensor kl = torch::full({3, 4}, 0.5, kF64);
  const torch::Tensor rewards = token_rewards(torch::tensor({2.0, -1.0, 5.0}, kF64), kl, mask, 0.1);
  const torch::Tensor expected = torch::tensor({{-0.05, -0.05, 1.95, 0.0}, {-1.05, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0}}, kF64);
  EXPECT_LT(max_difference(rewards, expected), 1e-15);
}

// GAE worked by hand for one row of two tokens, γ = 0.5, λ = 0.5: a finished response (bootstrap 0) and
// the same response cut at the length limit (bootstrap 4: its return continues).
TEST(RlMathTest, GaeBootstrapsOnlyCutResponses) {
  const torch::Tensor rewards = torch::tensor({{1.0, 2.0}, {1.0, 2.0}}, kF64);
  const torch::Tensor values = torch::tensor({{0.5, 1.0}, {0.5, 1.0}}, kF64);
  const torch::Tensor mask = lengths_mask({2, 2}, 2);
  const Advantages a = gae(rewards, values, mask, torch::tensor({0.0, 4.0}, kF64), 0.5, 0.5);
  // Finished: δ1 = 2 − 1 = 1, A1 = 1; δ0 = 1 + 0.5·1 − 0.5 = 1, A0 = 1 + 0.25·1 = 1.25.
  // Cut: δ1 = 2 + 0.5·4 − 1 = 3, A1 = 3; δ0 = 1, A0 = 1 + 0.25·3 = 1.75.
  const torch::Tensor expected = torch::tensor({{1.25, 1.0}, {1.75, 3.0}}, kF64);
  EXPECT_LT(max_difference(a.advantages, expected), 1e-15);
  EXPECT_LT(max_difference(a.returns, expected + values), 1e-15);
}

// GRPO with β = 0 at its first step (ratio 1): the group-normalised advantages sum to 0 in every group,
// so the sequence-mean loss is exactly 0 (up to rounding), whatever the lengths.
TEST(RlMathTest, GrpoLossIsZeroAtTheFirstStepWithoutKl) {
  torch::manual_seed(5);
  const torch::Tensor mask = lengths_mask({3, 5, 1, 4, 2, 2}, 5);
  const torch::Tensor adv = group_advantages(torch::randn({6}, kF64), 3, RewardScaling::Group).unsqueeze(1).expand({6, 5});
  const torch::Tensor logp = -torch::rand({6, 5}, kF64);
  const PolicyTerms terms = clipped_policy_loss(logp, logp, adv, 0.2, 0.2);
  EXPECT_TRUE(terms.ratio.equal(torch::ones_like(logp)));
  EXPECT_LT(std::abs(aggregate(terms.loss, mask, Aggregation::SequenceMean, counts_of(mask)).item<double>()), 1e-15);
  EXPECT_EQ(terms.clipped.sum().item<int64_t>(), 0);
}

// The adaptive KL coefficient of Ziegler et al. worked by hand: KL twice the target moves it by the
// clipped +20% of samples / horizon; a fixed one never moves.
TEST(RlMathTest, AdaptiveKlCoefficientFollowsZiegler) {
  KlController adaptive{0.1, 6.0, 1000.0};
  adaptive.update(12.0, 100);
  EXPECT_NEAR(adaptive.coef, 0.1 * (1 + 0.2 * 0.1), 1e-15);
  adaptive.update(5.4, 500);
  EXPECT_NEAR(adaptive.coef, 0.1 * 1.02 * (1 - 0.1 * 0.5), 1e-15);
  KlController fixed{0.1};
  fixed.update(100.0, 100);
  EXPECT_EQ(fixed.coef, 0.1);
}

}  // namespace
}  // namespace kuafu::chat
