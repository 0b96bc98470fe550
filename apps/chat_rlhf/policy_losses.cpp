#include "apps/chat_rlhf/policy_losses.h"

#include <limits>

#include "core/nn/generation.h"
#include "core/util/error.h"

namespace kuafu::chat {

torch::Tensor sampled_logprobs(const torch::Tensor& logits, const torch::Tensor& tokens, double temperature,
                               int64_t top_k, double top_p, int64_t vocab_limit) {
  KUAFU_CHECK(logits.dim() == 3 && tokens.sizes() == logits.sizes().slice(0, 2), "sampled_logprobs takes logits [B, T, V] and tokens [B, T]; got ",
              logits.sizes(), " and ", tokens.sizes());
  KUAFU_CHECK(temperature > 0, "log-probabilities need a temperature > 0 (greedy decoding has none), got ", temperature);
  torch::Tensor scaled = logits.to(at::promote_types(logits.scalar_type(), torch::kFloat32)) / temperature;
  const int64_t vocab = scaled.size(-1);
  if (vocab_limit > 0 && vocab_limit < vocab) {
    scaled = torch::cat({scaled.narrow(-1, 0, vocab_limit),
                         torch::full_like(scaled.narrow(-1, vocab_limit, vocab - vocab_limit), -std::numeric_limits<double>::infinity())}, -1);
  }
  const torch::Tensor index = tokens.unsqueeze(-1);
  if (top_k > 0 || top_p < 1.0) {
    torch::Tensor kept;
    {
      torch::NoGradGuard no_grad;  // which ids survive is a choice, not a function to differentiate
      kept = torch::isfinite(nn::filter_logits(scaled.detach(), top_k, top_p)).scatter(-1, index, true);
    }
    scaled = scaled.masked_fill(kept.logical_not(), -std::numeric_limits<double>::infinity());
  }
  return torch::log_softmax(scaled, -1).gather(-1, index).squeeze(-1);
}

torch::Tensor entropy(const torch::Tensor& logits, double temperature) {
  const torch::Tensor logp = torch::log_softmax(logits.to(at::promote_types(logits.scalar_type(), torch::kFloat32)) / temperature, -1);
  return -(logp.exp() * logp).sum(-1);
}

KlEstimator kl_estimator_named(const std::string& name) {
  if (name == "k1") return KlEstimator::K1;
  if (name == "k2") return KlEstimator::K2;
  if (name == "k3") return KlEstimator::K3;
  throw Error("the KL estimator must be \"k1\", \"k2\" or \"k3\", got \"" + name + "\"");
}

torch::Tensor kl_estimate(const torch::Tensor& logprobs, const torch::Tensor& ref_logprobs, KlEstimator estimator) {
  const torch::Tensor log_ratio = ref_logprobs - logprobs;  // log(π_ref / π)
  switch (estimator) {
    case KlEstimator::K1:
      return -log_ratio;
    case KlEstimator::K2:
      return 0.5 * log_ratio * log_ratio;
    case KlEstimator::K3:
      return torch::exp(log_ratio) - 1 - log_ratio;
  }
  return -log_ratio;
}

namespace {

PolicyTerms clipped_surrogate(const torch::Tensor& ratio, const torch::Tensor& advantages, double clip_low, double clip_high) {
  const torch::Tensor a = advantages.detach();
  const torch::Tensor unclipped = -a * ratio;
  const torch::Tensor clipped = -a * torch::clamp(ratio, 1.0 - clip_low, 1.0 + clip_high);
  return {torch::max(unclipped, clipped), clipped > unclipped, ratio};
}

}  // namespace

PolicyTerms clipped_policy_loss(const torch::Tensor& logprobs, const torch::Tensor& old_logprobs,
                                const torch::Tensor& advantages, double clip_low, double clip_high) {
  return clipped_surrogate(torch::exp(logprobs - old_logprobs.detach()), advantages, clip_low, clip_high);
}

ImportanceLevel importance_level_named(const std::string& name) {
  if (name == "token") return ImportanceLevel::Token;
  if (name == "sequence") return ImportanceLevel::Sequence;
  throw Error("the importance sampling level must be \"token\" or \"sequence\", got \"" + name + "\"");
}

PolicyTerms clipped_policy_loss(const torch::Tensor& logprobs, const torch::Tensor& old_logprobs,
                                const torch::Tensor& advantages, double clip_low, double clip_high,
                                const torch::Tensor& mask, ImportanceLevel level) {
  if (level == ImportanceLevel::Token) return clipped_policy_loss(logprobs, old_logprobs, advantages, clip_low, clip_high);
  const torch::Tensor m = mask.to(logprobs.scalar_type());
  const torch::Tensor log_ratio = (logprobs - old_logprobs.detach()) * m;                         // [B, R]
  const torch::Tensor sequence = log_ratio.sum(1, /*keepdim=*/true) / m.sum(1, true).clamp_min(1);  // [B, 1]
  return clipped_surrogate(torch::exp(sequence).expand_as(logprobs), advantages, clip_low, clip_high);
}

torch::Tensor clipped_value_loss(const torch::Tensor& values, const torch::Tensor& old_values,
                                 const torch::Tensor& returns, double clip) {
  const torch::Tensor old = old_values.detach();
  const torch::Tensor target = returns.detach();
  const torch::Tensor clipped = old + torch::clamp(values - old, -clip, clip);
  return 0.5 * torch::max((values - target).square(), (clipped - target).square());
}

Aggregation aggregation_named(const std::string& name) {
  if (name == "token-mean") return Aggregation::TokenMean;
  if (name == "sequence-mean") return Aggregation::SequenceMean;
  if (name == "constant") return Aggregation::Constant;
  throw Error("the loss aggregation must be \"token-mean\", \"sequence-mean\" or \"constant\", got \"" + name + "\"");
}

torch::Tensor aggregate(const torch::Tensor& per_token, const torch::Tensor& mask, Aggregation aggregation,
                        const BatchCounts& whole) {
  const torch::Tensor m = mask.to(per_token.scalar_type());
  const torch::Tensor masked = per_token * m;  // [B, R]
  switch (aggregation) {
    case Aggregation::TokenMean:
      return masked.sum() / std::max(whole.tokens, 1.0);
    case Aggregation::SequenceMean:
      return (masked.sum(1) / m.sum(1).clamp_min(1)).sum() / std::max(whole.sequences, 1.0);
    case Aggregation::Constant:
      KUAFU_CHECK(whole.max_length > 0, "Dr. GRPO's constant normaliser needs the longest response length");
      return masked.sum() / (std::max(whole.sequences, 1.0) * static_cast<double>(whole.max_length));
  }
  return masked.sum();
}

BatchCounts counts_of(const torch::Tensor& mask, int64_t max_length) {
  return {static_cast<double>(mask.sum().item<int64_t>()), static_cast<double>(mask.size(0)),
          max_length > 0 ? max_length : mask.size(1)};
}

}  // namespace kuafu::chat
