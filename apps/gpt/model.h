// GPT-2 with Hugging Face's parameter names and shapes (transformer.h.0.attn.c_attn.weight is
// [C, 3C], Conv1D layout), tied input/output embeddings, GPT-2 initialisation and a KV cache.
#pragma once

#include <vector>

#include "core/nn/causal_lm.h"
#include "core/nn/language_model.h"
#include "core/nn/transformer_block.h"
#include "core/parallel/tensor/factory.h"

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

// GPT-2's transformer block: pre-norm, causal, fused c_attn ([C, 3C] Conv1D, cut per q|k|v segment so
// each rank owns whole heads), tanh GELU, under Hugging Face's names.
nn::TransformerBlockSpec block_spec(const GPTConfig& config);

struct TransformerImpl : torch::nn::Module {
  TransformerImpl(const GPTConfig& config, const parallel::ModelOptions& options);
  std::shared_ptr<parallel::TokenEmbeddingImpl> wte;  // [V, C], also the output layer (this rank's block)
  torch::nn::AnyModule wpe;                           // [n_positions, C] (features cut like the stream's)
  torch::nn::Dropout drop{nullptr};
  std::shared_ptr<torch::nn::Module> h;  // children "0" .. "L-1"
  std::vector<nn::TransformerBlock> blocks;
  torch::nn::AnyModule ln_f;
};
TORCH_MODULE(Transformer);

// The model as maths: embeddings (the head), the blocks, the final norm with the tied output layer and
// loss (the tail). Strategies other than tensor parallelism apply from outside (train::ParallelModel).
struct GPTImpl : torch::nn::Module, nn::CausalLM {
  // `tp` (default: serial) says how layers are cut; a parallel model is initialised as the serial one
  // from the same seed, each rank keeping its blocks.
  explicit GPTImpl(const GPTConfig& config, parallel::ModelOptions options = {});

  // Logits [B, T, V] for tokens [B, T] (gathered on every rank under tensor parallelism). With
  // `caches` (one per layer) the tokens continue the cached sequence and their keys/values are appended.
  torch::Tensor forward(const torch::Tensor& tokens, std::vector<ops::KVCache>* caches = nullptr);
  // decode (nn::CausalLM's): the same for rows at their own positions with left padding (batched generation).
  // loss(tokens, targets) (nn::CausalLM's): under tensor parallelism every rank of the group passes the
  // same whole batch; each computes the rows its mode gives it.
  // tokens [B, T] continuing `past` cached positions -> the residual stream (this rank's block).
  torch::Tensor embed(const torch::Tensor& tokens, int64_t past = 0);
  torch::Tensor embed_at(const torch::Tensor& tokens, const torch::Tensor& positions) override;  // positions [B or 1, T]

  // hooks::BlockModel: head = embed, block i = layer i, tail = final norm, tied output layer, loss.
  torch::nn::Module& module() override { return *this; }
  int64_t num_blocks() const override { return config.n_layer; }
  hooks::ModelPart head_part() const override { return {"transformer.embed", {"transformer.wte", "transformer.wpe"}}; }
  hooks::ModelPart block_part(int64_t i) const override;
  hooks::ModelPart tail_part() const override { return {"transformer.head", {"transformer.ln_f", "transformer.wte"}}; }
  torch::Tensor tail_loss(const torch::Tensor& x, const torch::Tensor& targets) override;
  torch::Tensor tail_sums(const torch::Tensor& x, const torch::Tensor& targets) override;

  // nn::CausalLM: the trunk a head reads (the final stream through ln_f).
  std::vector<nn::TransformerBlock>& layers() override { return transformer->blocks; }
  torch::Tensor output_logits(const torch::Tensor& x) override { return transformer->wte->gather_logits(local_logits(x)); }
  torch::Tensor final_hidden(const torch::Tensor& x) override { return transformer->ln_f.forward(x); }
  int64_t final_width() const override { return config.n_embd; }
  std::vector<std::string> final_modules() const override { return {"transformer.ln_f"}; }
  int64_t positions() const override { return config.n_positions; }
  int64_t vocab_size() const override { return config.vocab_size; }
  void initialize() override;
  std::string family() const override { return "GPT-2"; }

  GPTConfig config;
  torch::Device device = torch::kCPU;  // where its serial and replicated layers live (the run's)
  Transformer transformer{nullptr};

 private:
  torch::Tensor local_logits(const torch::Tensor& x);  // tied output layer: this rank's block of the logits
};
TORCH_MODULE(GPT);

// The model as generation (core/nn/generation.h) drives it: logits of tokens continuing the caches.
nn::Decoder decoder(GPT& model);

}  // namespace kuafu::gpt
