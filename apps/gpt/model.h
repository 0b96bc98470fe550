// GPT-2 with Hugging Face's parameter names and shapes (transformer.h.0.attn.c_attn.weight is
// [C, 3C], Conv1D layout), tied input/output embeddings, GPT-2 initialisation and a KV cache.
#pragma once

#include <optional>
#include <vector>

#include "core/nn/attention.h"

namespace kuafu::gpt {

struct GPTConfig {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  double dropout = 0.0;  // embeddings, attention probabilities and residual branches
  double layer_norm_epsilon = 1e-5;

  int64_t parameter_count() const;  // with the output embedding tied to the input one
  // Forward + backward FLOPs per token at sequence length t: 6N + 12·L·C·t (the attention matmuls).
  double flops_per_token(int64_t t) const;
};

// Hugging Face's Conv1D: y = x W + b with W stored [in, out].
struct Conv1DImpl : torch::nn::Module {
  Conv1DImpl(int64_t in, int64_t out);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;  // [in, out]
  torch::Tensor bias;    // [out]
};
TORCH_MODULE(Conv1D);

struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x, nn::KVCache* cache);  // x [B, T, C]
  Conv1D c_attn{nullptr}, c_proj{nullptr};
  int64_t n_head;
  double dropout;
  torch::nn::Dropout resid_dropout{nullptr};
};
TORCH_MODULE(Attention);

struct MLPImpl : torch::nn::Module {
  explicit MLPImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  Conv1D c_fc{nullptr}, c_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(MLP);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x, nn::KVCache* cache);
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Attention attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

struct TransformerImpl : torch::nn::Module {
  explicit TransformerImpl(const GPTConfig& config);
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(Transformer);

struct GPTImpl : torch::nn::Module {
  explicit GPTImpl(const GPTConfig& config);

  // Logits [B, T, V] for tokens [B, T]. With `caches` (one per layer) the tokens continue the cached
  // sequence and their keys/values are appended.
  torch::Tensor forward(const torch::Tensor& tokens, std::vector<nn::KVCache>* caches = nullptr);
  // Mean cross-entropy of next-token prediction.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets);

  GPTConfig config;
  Transformer transformer{nullptr};
};
TORCH_MODULE(GPT);

struct SamplingOptions {
  int64_t max_new_tokens = 200;
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
  uint64_t seed = 0;
  std::optional<int64_t> stop_token;
};

// Continues `prompt` (token ids) with the KV cache; returns only the new tokens.
std::vector<int64_t> generate(GPT& model, const std::vector<int64_t>& prompt, const SamplingOptions& options);

// Keeps the logits a sampler may choose from (top-k, then nucleus top-p); others become -inf.
torch::Tensor filter_logits(torch::Tensor logits, int64_t top_k, double top_p);  // logits [V]

}  // namespace kuafu::gpt
