// What the RLHF stages read of a causal language model (the policy, its frozen reference): the
// log-probabilities of whole rows' tokens, with padding anywhere, as the sampler drew them.
#pragma once

#include "core/nn/causal_lm.h"
#include "core/nn/generation.h"

namespace kuafu::chat {

// Log-probabilities [B, T − 1] of tokens[:, 1:] given the tokens before each, from whole rows (tokens,
// real [B, T]: padding anywhere) under `sampling`'s temperature, top-k, top-p and vocabulary limit
// (temperature 0, greedy, reads as 1). Entries whose token is padding are meaningless; mask them.
torch::Tensor next_token_logprobs(nn::CausalLM& model, const torch::Tensor& tokens, const torch::Tensor& real,
                                  const nn::SamplingOptions& sampling = {});
// The same with each next token's entropy [B, T − 1] (of the temperature-scaled distribution).
struct NextTokens {
  torch::Tensor logprobs, entropy;
};
NextTokens next_token_outputs(nn::CausalLM& model, const torch::Tensor& tokens, const torch::Tensor& real,
                              const nn::SamplingOptions& sampling, bool with_entropy);

// The same from whole logits [B, T, V] of the rows already computed (a shared trunk's one pass).
NextTokens next_token_outputs_of(const torch::Tensor& logits, const torch::Tensor& tokens, const nn::SamplingOptions& sampling,
                                 bool with_entropy);

// Sum [B] of each row's learned tokens' log-probabilities (learned [B, T]: the response tokens, as
// io::InstructionExample marks them; token 0 is never learned).
torch::Tensor learned_logprob_sums(nn::CausalLM& model, const torch::Tensor& tokens, const torch::Tensor& real,
                                   const torch::Tensor& learned);

}  // namespace kuafu::chat
