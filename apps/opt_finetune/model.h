// OPT (Meta's Open Pre-trained Transformers) with Hugging Face's names and behaviour: learned positions
// offset by 2 and taken from each row's real tokens (left padding), ReLU MLP, separate q/k/v, pre-LN
// or opt-350m's post-LN (no final layer norm), the embedding projected in and out where
// word_embed_proj_dim differs from the hidden size, and the output layer tied to the token embedding.
// The block is nn::TransformerBlock; sampling is nn::generate.
#pragma once

#include <vector>

#include "core/nn/causal_lm.h"
#include "core/nn/language_model.h"
#include "core/nn/transformer_block.h"
#include "core/parallel/tensor/factory.h"

namespace kuafu::opt {

// Field names follow Hugging Face's OPTConfig.
struct OPTConfig {
  int64_t vocab_size = 50272;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t ffn_dim = 3072;
  int64_t num_attention_heads = 12;
  int64_t max_position_embeddings = 2048;
  int64_t word_embed_proj_dim = 768;  // the token embedding's width; projected to hidden_size when it differs
  bool do_layer_norm_before = true;   // false: post-LN (opt-350m)
  bool remove_final_layer_norm = false;
  double dropout = 0.1;            // embeddings and residual branches
  double attention_dropout = 0.0;  // attention probabilities
  double layer_norm_eps = 1e-5;

  static constexpr int64_t kPositionOffset = 2;  // OPT's learned positions start at row 2
  bool has_final_layer_norm() const { return do_layer_norm_before && !remove_final_layer_norm; }
  bool projects() const { return word_embed_proj_dim != hidden_size; }
  int64_t parameter_count() const;  // output layer tied to the token embedding
  // Forward + backward FLOPs per token at sequence length t: 6N + 12·L·H·t (the attention matmuls).
  double flops_per_token(int64_t t) const;
  void validate() const;  // kuafu::Error naming the field
};

nn::TransformerBlockSpec block_spec(const OPTConfig& config);

struct DecoderImpl : torch::nn::Module {
  DecoderImpl(const OPTConfig& config, const parallel::ModelOptions& options);
  std::shared_ptr<parallel::TokenEmbeddingImpl> embed_tokens;  // [V, word_embed_proj_dim], also the output layer
  torch::nn::AnyModule embed_positions;                         // [max_position_embeddings + 2, H]
  torch::nn::AnyModule project_in, project_out;  // when projects(): serial, no bias
  std::shared_ptr<torch::nn::Module> layers;                    // children "0" .. "L-1"
  std::vector<nn::TransformerBlock> blocks;
  torch::nn::AnyModule final_layer_norm;  // when has_final_layer_norm()
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(Decoder);

// The model as maths: embeddings (the head), the blocks, final norm, projection and tied output
// layer with the loss (the tail). Strategies other than tensor parallelism apply from outside.
struct OPTForCausalLMImpl : torch::nn::Module, nn::CausalLM {
  explicit OPTForCausalLMImpl(const OPTConfig& config, parallel::ModelOptions options = {});

  // Logits [B, T, V] of `inputs`: tokens [B, T] at positions 0..T-1 (no padding), or packed rows
  // [B, 2, T], token ids over document ids (contiguous runs), each document attending only to itself
  // with positions counted from its own start.
  torch::Tensor forward(const torch::Tensor& inputs);
  // tokens [B, T], positions [B or 1, T] (counts of real tokens before each) -> the residual stream.
  torch::Tensor embed_at(const torch::Tensor& tokens, const torch::Tensor& positions) override;

  torch::nn::Module& module() override { return *this; }
  int64_t num_blocks() const override { return config.num_hidden_layers; }
  hooks::ModelPart head_part() const override;
  hooks::ModelPart block_part(int64_t i) const override;
  hooks::ModelPart tail_part() const override;
  torch::Tensor tail_loss(const torch::Tensor& x, const torch::Tensor& targets) override;
  torch::Tensor tail_sums(const torch::Tensor& x, const torch::Tensor& targets) override;

  // nn::CausalLM: the trunk a head reads.
  std::vector<nn::TransformerBlock>& layers() override { return decoder->blocks; }
  torch::Tensor output_logits(const torch::Tensor& x) override;
  // The final stream [B, T, H] -> [B, T, word_embed_proj_dim]: final norm, projection (what a head reads).
  torch::Tensor final_hidden(const torch::Tensor& x) override;
  int64_t final_width() const override { return config.word_embed_proj_dim; }
  std::vector<std::string> final_modules() const override;
  int64_t positions() const override { return config.max_position_embeddings; }
  int64_t vocab_size() const override { return config.vocab_size; }
  void initialize() override;
  std::string family() const override { return "OPT"; }

  OPTConfig config;
  torch::Device device = torch::kCPU;  // where its serial and replicated layers live (the run's)
  torch::nn::Module* model = nullptr;  // "model", holding "decoder" (Hugging Face's nesting)
  Decoder decoder{nullptr};

 private:
  torch::Tensor local_logits(const torch::Tensor& x);      // and the tied output layer (this rank's block)
};
TORCH_MODULE(OPTForCausalLM);

// The model as generation drives it.
nn::Decoder decoder(OPTForCausalLM& model);

}  // namespace kuafu::opt
