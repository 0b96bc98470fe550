#include "apps/chat_rlhf/policy.h"

#include "apps/chat_rlhf/policy_losses.h"

namespace kuafu::chat {

NextTokens next_token_outputs(nn::CausalLM& model, const torch::Tensor& tokens, const torch::Tensor& real,
                              const nn::SamplingOptions& sampling, bool with_entropy) {
  return next_token_outputs_of(model.whole_logits(nn::whole_rows_step(tokens, real)), tokens, sampling, with_entropy);
}

NextTokens next_token_outputs_of(const torch::Tensor& whole_logits, const torch::Tensor& tokens, const nn::SamplingOptions& sampling,
                                 bool with_entropy) {
  const int64_t t = tokens.size(1);
  const torch::Tensor logits = whole_logits.narrow(1, 0, t - 1);  // [B, T - 1, V]
  const double temperature = sampling.temperature > 0 ? sampling.temperature : 1.0;
  NextTokens out;
  out.logprobs = sampled_logprobs(logits, tokens.narrow(1, 1, t - 1), temperature, sampling.top_k, sampling.top_p,
                                  sampling.vocab_limit);
  if (with_entropy) out.entropy = entropy(logits, temperature);
  return out;
}

torch::Tensor next_token_logprobs(nn::CausalLM& model, const torch::Tensor& tokens, const torch::Tensor& real,
                                  const nn::SamplingOptions& sampling) {
  return next_token_outputs(model, tokens, real, sampling, /*with_entropy=*/false).logprobs;
}

torch::Tensor learned_logprob_sums(nn::CausalLM& model, const torch::Tensor& tokens, const torch::Tensor& real,
                                   const torch::Tensor& learned) {
  const int64_t t = tokens.size(1);
  const torch::Tensor logprobs = next_token_logprobs(model, tokens, real);  // [B, T - 1]
  return (logprobs * learned.narrow(1, 1, t - 1).to(logprobs.scalar_type())).sum(1);
}

}  // namespace kuafu::chat
