#include "apps/chat_rlhf/advantages.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/dist/collectives.h"
#include "core/util/error.h"

namespace kuafu::chat {
namespace {

// [Σx, Σx², n] over mask, summed over `group` when given.
torch::Tensor masked_moments(const torch::Tensor& x, const torch::Tensor& mask, const dist::ProcessGroup* group) {
  const torch::Tensor m = mask.to(x.scalar_type());
  torch::Tensor moments = torch::stack({(x * m).sum(), (x * x * m).sum(), m.sum()}).to(torch::kFloat64);
  if (group && !group->trivial()) {
    moments = moments.to(group->device());
    dist::all_reduce(moments, *group);
    moments = moments.to(x.device());
  }
  return moments;
}

}  // namespace

torch::Tensor masked_mean(const torch::Tensor& x, const torch::Tensor& mask, const dist::ProcessGroup* group) {
  const torch::Tensor moments = masked_moments(x.detach(), mask, group);
  return (moments[0] / moments[2].clamp_min(1)).to(x.scalar_type());
}

torch::Tensor masked_var(const torch::Tensor& x, const torch::Tensor& mask, const dist::ProcessGroup* group) {
  const torch::Tensor moments = masked_moments(x.detach(), mask, group);
  const torch::Tensor n = moments[2];
  const torch::Tensor mean = moments[0] / n.clamp_min(1);
  // Σ(x − mean)² = Σx² − n·mean², then Bessel's correction.
  return ((moments[1] - n * mean * mean) / (n - 1).clamp_min(1)).clamp_min(0).to(x.scalar_type());
}

torch::Tensor whiten(const torch::Tensor& x, const torch::Tensor& mask, bool shift_mean, const dist::ProcessGroup* group) {
  const torch::Tensor mean = masked_mean(x, mask, group);
  const torch::Tensor var = masked_var(x, mask, group);
  torch::Tensor white = (x - mean) * torch::rsqrt(var + 1e-8);
  if (!shift_mean) white = white + mean;
  return white * mask.to(x.scalar_type());
}

torch::Tensor last_real_index(const torch::Tensor& mask) { return mask.to(torch::kInt64).sum(1) - 1; }

torch::Tensor token_rewards(const torch::Tensor& score, const torch::Tensor& kl, const torch::Tensor& mask,
                            double kl_coef) {
  KUAFU_CHECK(kl.sizes() == mask.sizes() && score.dim() == 1 && score.size(0) == mask.size(0),
              "token_rewards takes score [B], kl and mask [B, R]; got ", score.sizes(), ", ", kl.sizes(), ", ", mask.sizes());
  const torch::Tensor m = mask.to(kl.scalar_type());
  torch::Tensor rewards = -kl_coef * kl * m;  // [B, R]
  const torch::Tensor last = last_real_index(mask);
  const torch::Tensor has_tokens = last >= 0;
  const torch::Tensor at_last = torch::zeros_like(rewards).scatter(
      1, last.clamp_min(0).unsqueeze(1), (score.to(rewards.scalar_type()) * has_tokens.to(rewards.scalar_type())).unsqueeze(1));
  return rewards + at_last;
}

Advantages gae(const torch::Tensor& rewards, const torch::Tensor& values, const torch::Tensor& mask,
               const torch::Tensor& bootstrap, double gamma, double lambda) {
  KUAFU_CHECK(rewards.sizes() == values.sizes() && rewards.sizes() == mask.sizes() && bootstrap.dim() == 1,
              "gae takes rewards, values and mask [B, R] and bootstrap [B]; got ", rewards.sizes(), ", ",
              values.sizes(), ", ", mask.sizes(), ", ", bootstrap.sizes());
  const int64_t length = rewards.size(1);
  const torch::Tensor m = mask.to(rewards.scalar_type());
  const torch::Tensor v = values.detach() * m;
  const torch::Tensor after_last = bootstrap.detach().to(rewards.scalar_type());
  std::vector<torch::Tensor> columns(static_cast<size_t>(length));
  torch::Tensor next_advantage = torch::zeros_like(after_last);
  for (int64_t t = length - 1; t >= 0; --t) {
    // The next state's value: the next token's where it is real, else the bootstrap past the last one.
    const torch::Tensor next_real = t + 1 < length ? m.select(1, t + 1) : torch::zeros_like(after_last);
    const torch::Tensor next_value = t + 1 < length ? next_real * v.select(1, t + 1) + (1 - next_real) * after_last : after_last;
    const torch::Tensor delta = rewards.select(1, t) + gamma * next_value - v.select(1, t);
    next_advantage = (delta + gamma * lambda * next_real * next_advantage) * m.select(1, t);
    columns[static_cast<size_t>(t)] = next_advantage;
  }
  const torch::Tensor advantages = torch::stack(columns, 1);
  return {advantages, (advantages + v) * m};
}

torch::Tensor group_advantages(const torch::Tensor& rewards, int64_t group_size, RewardScaling scaling) {
  KUAFU_CHECK(rewards.dim() == 1 && group_size > 0 && rewards.size(0) % group_size == 0, "GRPO's ", rewards.size(0),
              " rewards do not form groups of ", group_size);
  const torch::Tensor groups = rewards.detach().view({-1, group_size});  // [prompts, G]
  const torch::Tensor centred = (groups - groups.mean(1, /*keepdim=*/true)).reshape(-1);
  switch (scaling) {
    case RewardScaling::None:
      return centred;
    case RewardScaling::Group: {
      // std of one sample is 0 (torch gives NaN for n − 1 = 0): its advantage is 0 anyway.
      const torch::Tensor std = group_size > 1 ? groups.std(1, /*unbiased=*/true, /*keepdim=*/true) : torch::zeros_like(groups);
      return centred / (std.expand_as(groups).reshape(-1) + 1e-4);
    }
    case RewardScaling::Batch: {
      const torch::Tensor std = rewards.numel() > 1 ? rewards.detach().std(/*unbiased=*/true) : torch::zeros({}, rewards.options());
      return centred / (std + 1e-4);
    }
  }
  return centred;
}

RewardScaling reward_scaling_named(const std::string& name) {
  if (name == "group") return RewardScaling::Group;
  if (name == "batch") return RewardScaling::Batch;
  if (name == "none") return RewardScaling::None;
  throw Error("scale_rewards must be \"group\", \"batch\" or \"none\", got \"" + name + "\"");
}

void RunningMoments::update(const torch::Tensor& scores, const dist::ProcessGroup* group) {
  const torch::Tensor moments = masked_moments(scores.detach(), torch::ones_like(scores, torch::kBool), group);
  const double n = moments[2].item<double>();
  if (n <= 0) return;
  const double batch_mean = moments[0].item<double>() / n;
  const double batch_var = std::max(0.0, moments[1].item<double>() / n - batch_mean * batch_mean);  // population
  const double total = count + n, delta = batch_mean - mean;
  // Σ(x − mean)² of both parts about the merged mean: each part's own, and its offset from the merged mean.
  const double squares = var * count + batch_var * n + delta * delta * count * n / total;
  mean += delta * n / total;
  var = squares / total;
  count = total;
}

double RunningMoments::std() const { return count > 1 ? std::sqrt(var * count / (count - 1)) : std::sqrt(var); }

torch::Tensor scale_scores(const torch::Tensor& scores, const RunningMoments* moments, bool subtract_mean, double clip) {
  torch::Tensor scaled = scores;
  if (moments) {
    const double scale = moments->std() + static_cast<double>(std::numeric_limits<float>::epsilon());
    scaled = subtract_mean ? (scaled - moments->mean) / scale : scaled / scale;
  }
  return clip > 0 ? scaled.clamp(-clip, clip) : scaled;
}

void KlController::update(double kl_per_sequence, int64_t samples) {
  if (target <= 0) return;
  const double error = std::clamp(kl_per_sequence / target - 1.0, -0.2, 0.2);
  coef *= 1.0 + error * static_cast<double>(samples) / horizon;
}

}  // namespace kuafu::chat
