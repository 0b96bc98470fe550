// What RLHF turns rewards into before a policy update: per-token rewards (the sequence score on the
// response's last real token, minus the KL penalty on every token), generalised advantage estimation,
// whitening, GRPO's group-normalised advantages, and the adaptive KL coefficient. Every tensor over
// responses is [B, R] with `mask` [B, R] true on the real response tokens: a row's real tokens are
// contiguous from column 0 (responses are right-padded after their EOS or cut), so statistics never see
// padding, and where a row sits in a left- or right-padded model batch does not matter here.
#pragma once

#include <torch/torch.h>

#include "core/dist/process_group.h"

namespace kuafu::chat {

// Mean of x over mask's true entries (0 when there are none); with `group`, over every rank's entries.
torch::Tensor masked_mean(const torch::Tensor& x, const torch::Tensor& mask, const dist::ProcessGroup* group = nullptr);
// Unbiased variance (n - 1) of x over mask's true entries, as the mean above.
torch::Tensor masked_var(const torch::Tensor& x, const torch::Tensor& mask, const dist::ProcessGroup* group = nullptr);
// (x - mean) / sqrt(var + 1e-8) over mask's true entries (the mean added back when !shift_mean);
// masked-out entries are 0. With `group`, the statistics are the whole batch's across its ranks.
torch::Tensor whiten(const torch::Tensor& x, const torch::Tensor& mask, bool shift_mean = true,
                     const dist::ProcessGroup* group = nullptr);

// Index [B] of each row's last real response token (-1 for an empty response).
torch::Tensor last_real_index(const torch::Tensor& mask);

// Per-token rewards [B, R]: -kl_coef * kl on every real token, plus `score` [B] on the last real one
// only (never on padding after it, whatever id the padding has; an empty response gets nothing).
torch::Tensor token_rewards(const torch::Tensor& score, const torch::Tensor& kl, const torch::Tensor& mask,
                            double kl_coef);

struct Advantages {
  torch::Tensor advantages;  // [B, R], 0 on padding
  torch::Tensor returns;     // [B, R]: advantages + values, the value model's targets
};
// Generalised advantage estimation (Schulman et al., 2016): δ_t = r_t + γ V_{t+1} − V_t, A_t = δ_t + γλ A_{t+1}.
// values [B, R]: V of the state before each response token. bootstrap [B]: V of the state after the last
// real token — 0 for a response that ended (EOS), the value model's estimate for one cut at the length
// limit (its return continues past the cut).
Advantages gae(const torch::Tensor& rewards, const torch::Tensor& values, const torch::Tensor& mask,
               const torch::Tensor& bootstrap, double gamma, double lambda);

// GRPO: rewards [B] in groups of `group_size` consecutive rows (the samples of one prompt); the
// advantage is the reward less its group's mean, divided by the group's standard deviation (Group), the
// whole batch's (Batch) or nothing (None), + 1e-4 as trl divides. Standard deviations are unbiased.
enum class RewardScaling { Group, Batch, None };
torch::Tensor group_advantages(const torch::Tensor& rewards, int64_t group_size, RewardScaling scaling);
RewardScaling reward_scaling_named(const std::string& name);  // "group", "batch", "none"

// The running mean and variance of every score so far, each rollout's batch merged in (Chan et al.'s
// parallel update; with `group`, the batch is every rank's scores), started as trl's RunningMoments starts
// (mean 0, variance 1, count 1e-24) so that its scaling is trl's use_score_scaling.
struct RunningMoments {
  double count = 1e-24, mean = 0, var = 1;  // var: the population variance of all merged scores
  void update(const torch::Tensor& scores, const dist::ProcessGroup* group = nullptr);
  double std() const;  // unbiased: sqrt(var · n / (n − 1))
};
// PPO's score scaling (trl's use_score_scaling, use_score_norm and score_clip): scores [B] divided by the
// running std (+ float32's epsilon), less the running mean first when `subtract_mean`; then clipped to
// ±clip when clip > 0.
torch::Tensor scale_scores(const torch::Tensor& scores, const RunningMoments* moments, bool subtract_mean, double clip);

// The KL coefficient: fixed (target 0), or adapted towards a target KL per sequence (Ziegler et al.,
// 2019): coef *= 1 + clip(kl / target − 1, −0.2, 0.2) · samples / horizon.
struct KlController {
  double coef = 0.05;
  double target = 0;  // 0: fixed
  double horizon = 10000;
  void update(double kl_per_sequence, int64_t samples);
};

}  // namespace kuafu::chat
