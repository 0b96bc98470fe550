// The per-token quantities of policy optimisation and how a loss is averaged over them. Tensors over
// responses are [B, R] with `mask` [B, R] true on real response tokens (see advantages.h).
#pragma once

#include <torch/torch.h>

#include <string>

namespace kuafu::chat {

// Log-probabilities [B, T] of `tokens` [B, T] under logits [B, T, V] as the sampler drew them: divided
// by `temperature`, then top-k and top-p filtered, ids at or above `vocab_limit` (when > 0) never
// drawn, renormalised. The ratio of PPO and GRPO must use this distribution, or its first step is not
// at ratio 1. The token itself is always kept: a recomputed forward that rounds differently from the
// decoding one may push a sampled token just outside the nucleus, which would give −inf.
torch::Tensor sampled_logprobs(const torch::Tensor& logits, const torch::Tensor& tokens, double temperature = 1.0,
                               int64_t top_k = 0, double top_p = 1.0, int64_t vocab_limit = 0);
// Entropy [B, T] of the softmax of logits [B, T, V] / temperature (before any filtering).
torch::Tensor entropy(const torch::Tensor& logits, double temperature = 1.0);

// Schulman's estimators of KL(π ‖ π_ref) per token, from samples of π: k1 = log π − log π_ref,
// k2 = ½ (log π_ref − log π)², k3 = π_ref/π − 1 − log(π_ref/π).
enum class KlEstimator { K1, K2, K3 };
KlEstimator kl_estimator_named(const std::string& name);  // "k1", "k2", "k3"
torch::Tensor kl_estimate(const torch::Tensor& logprobs, const torch::Tensor& ref_logprobs, KlEstimator estimator);

// PPO's clipped surrogate per token: max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high)), ρ = exp(logπ − logπ_old).
struct PolicyTerms {
  torch::Tensor loss;     // [B, R]
  torch::Tensor clipped;  // [B, R] bool: the clipped term was the larger (no gradient flows)
  torch::Tensor ratio;    // [B, R]
};
PolicyTerms clipped_policy_loss(const torch::Tensor& logprobs, const torch::Tensor& old_logprobs,
                                const torch::Tensor& advantages, double clip_low, double clip_high);
// Where the importance ratio ρ is taken: per token (PPO, GRPO), or per sequence (GSPO, Zheng et al. 2025:
// ρ_i = exp of the mean of log π − log π_old over response i's real tokens, the same for each of its
// tokens; trl's importance_sampling_level = "sequence").
enum class ImportanceLevel { Token, Sequence };
ImportanceLevel importance_level_named(const std::string& name);  // "token", "sequence"
// The clipped surrogate with ρ taken at `level` over `mask` [B, R]'s real tokens.
PolicyTerms clipped_policy_loss(const torch::Tensor& logprobs, const torch::Tensor& old_logprobs,
                                const torch::Tensor& advantages, double clip_low, double clip_high,
                                const torch::Tensor& mask, ImportanceLevel level);
// PPO's clipped value loss per token: ½ max((V − R)², (V_old + clip(V − V_old, ±ε) − R)²).
torch::Tensor clipped_value_loss(const torch::Tensor& values, const torch::Tensor& old_values,
                                 const torch::Tensor& returns, double clip);

// How a per-token loss becomes one number: a mean over every token (TokenMean), a mean over sequences of
// each one's token mean (SequenceMean), or Dr. GRPO's sum over tokens / (sequences · max_length)
// (Constant), whose normaliser depends on no response's length.
enum class Aggregation { TokenMean, SequenceMean, Constant };
Aggregation aggregation_named(const std::string& name);  // "token-mean", "sequence-mean", "constant"

// The counts of the whole batch a loss is averaged over, across its micro-batches and ranks.
struct BatchCounts {
  double tokens = 0;     // real tokens
  double sequences = 0;  // rows
  int64_t max_length = 0;  // Constant: the longest a response may be
};
// This micro-batch's share of the whole batch's aggregated loss: the shares of its micro-batches and
// ranks sum to the loss of the batch taken at once (x₁/n₁ + x₂/n₂ would weight a short micro-batch's
// tokens more than a long one's).
torch::Tensor aggregate(const torch::Tensor& per_token, const torch::Tensor& mask, Aggregation aggregation,
                        const BatchCounts& whole);
// The counts of one batch, for a batch taken whole.
BatchCounts counts_of(const torch::Tensor& mask, int64_t max_length = 0);

}  // namespace kuafu::chat
