// Sampling from a causal language model that decodes with a key-value cache: greedy or with
// temperature, top-k and nucleus (top-p) filtering, drawn from a seeded host generator (the same tokens
// on every device), stopping at a stop token; when the context fills, decoding restarts from the last
// half of it.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "core/ops/attention.h"

namespace kuafu::nn {

struct SamplingOptions {
  int64_t max_new_tokens = 200;
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
  uint64_t seed = 0;
  std::optional<int64_t> stop_token;
};

// A causal language model as generation sees it.
struct Decoder {
  // Logits [B, T, V] of tokens [B, T] continuing the sequence `caches` hold (empty: a new one; one cache
  // per layer, appended to as it runs).
  std::function<torch::Tensor(const torch::Tensor& tokens, std::vector<ops::KVCache>& caches)> forward;
  int64_t context = 0;  // positions the model covers
  torch::Device device = torch::kCPU;
};

// Continues `prompt` (token ids); returns only the new tokens. The model should be in eval mode.
std::vector<int64_t> generate(const Decoder& decoder, const std::vector<int64_t>& prompt, const SamplingOptions& options);

// Keeps the logits a sampler may choose from (top-k, then nucleus top-p); others become -inf.
torch::Tensor filter_logits(torch::Tensor logits, int64_t top_k, double top_p);  // logits [V]

}  // namespace kuafu::nn
