// The Llama family with Hugging Face's names and behaviour, one decoder for four config.json model_types:
// "llama" (LlamaForCausalLM), "qwen2" (q/k/v biases), "qwen3" (RMSNorm over each head's queries and keys)
// and "mistral" (sliding-window attention). Every block is nn::TransformerBlock with RMSNorm, rotary
// positions, grouped-query attention and a SwiGLU MLP; the output layer is the token embedding or an
// untied lm_head. Positions live in the blocks (rotary), so a row's left padding needs no offset.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "core/nn/causal_lm.h"
#include "core/nn/language_model.h"
#include "core/nn/rotary.h"
#include "core/nn/transformer_block.h"
#include "core/parallel/tensor/factory.h"

namespace kuafu::opt {

// Field names follow transformers' LlamaConfig / Qwen2Config / Qwen3Config / MistralConfig.
struct LlamaConfig {
  std::string model_type = "llama";  // llama | qwen2 | qwen3 | mistral
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 128;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double attention_dropout = 0.0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // llama, qwen3: every attention projection; qwen2 always has q/k/v biases
  bool mlp_bias = false;        // llama
  nn::RotarySpec rope;          // head_dim and max_positions filled from the sizes above
  int64_t sliding_window = 0;   // the window of the layers that slide (0: none)
  std::vector<bool> sliding_layers;  // [layer] whether it slides (Qwen's layer_types; Mistral: all)
  nlohmann::json token_ids = nlohmann::json::object();  // bos/eos/pad_token_id as the folder gave them

  std::string family() const;  // "Llama", "Qwen2", "Qwen3", "Mistral"
  std::string architecture() const;  // "LlamaForCausalLM", ...
  bool qkv_bias() const { return model_type == "qwen2" || attention_bias; }
  bool out_bias() const { return model_type != "qwen2" && attention_bias; }
  bool qk_norm() const { return model_type == "qwen3"; }
  int64_t context() const {
    return rope.type == "dynamic" ? static_cast<int64_t>(rope.factor * static_cast<double>(max_position_embeddings))
                                  : max_position_embeddings;
  }
  int64_t parameter_count() const;
  // Forward + backward FLOPs per token at sequence length t: 6N + 12·L·(heads·head_dim)·t.
  double flops_per_token(int64_t t) const;
  void validate() const;  // kuafu::Error naming the field
};

nn::TransformerBlockSpec block_spec(const LlamaConfig& config, int64_t layer);

// The model as maths: the token embedding (the head), the blocks, the final norm and the output layer
// with the loss (the tail). Strategies other than tensor parallelism apply from outside.
struct LlamaForCausalLMImpl : torch::nn::Module, nn::CausalLM {
  explicit LlamaForCausalLMImpl(const LlamaConfig& config, parallel::ModelOptions options = {});

  // Logits [B, T, V] of tokens [B, T] at positions 0..T-1, or of packed rows [B, 2, T] (token ids over
  // document ids), each document attending only to itself with positions counted from its own start.
  torch::Tensor forward(const torch::Tensor& inputs);
  // tokens [B, T] -> the stream [B, T, H]; the positions reach the blocks, not the embedding.
  torch::Tensor embed_at(const torch::Tensor& tokens, const torch::Tensor& positions) override;

  torch::nn::Module& module() override { return *this; }
  int64_t num_blocks() const override { return config.num_hidden_layers; }
  hooks::ModelPart head_part() const override;
  hooks::ModelPart block_part(int64_t i) const override;
  hooks::ModelPart tail_part() const override;
  torch::Tensor tail_loss(const torch::Tensor& x, const torch::Tensor& targets) override;
  torch::Tensor tail_sums(const torch::Tensor& x, const torch::Tensor& targets) override;

  std::vector<nn::TransformerBlock>& layers() override { return blocks; }
  torch::Tensor output_logits(const torch::Tensor& x) override;
  torch::Tensor final_hidden(const torch::Tensor& x) override { return norm.forward(x); }
  int64_t final_width() const override { return config.hidden_size; }
  std::vector<std::string> final_modules() const override { return {"model.norm"}; }
  // The context: max_position_embeddings, stretched by the factor under dynamic NTK rope, whose purpose
  // is to run past it (transformers enforces no limit).
  int64_t positions() const override { return config.context(); }
  int64_t vocab_size() const override { return config.vocab_size; }
  void initialize() override;
  std::string family() const override { return config.family(); }

  LlamaConfig config;
  torch::nn::Module* model = nullptr;                           // "model" (Hugging Face's nesting)
  std::shared_ptr<parallel::TokenEmbeddingImpl> embed_tokens;  // model.embed_tokens [V, H]
  std::vector<nn::TransformerBlock> blocks;                     // model.layers.<i>
  torch::nn::AnyModule norm;                                    // model.norm
  std::shared_ptr<parallel::TokenEmbeddingImpl> lm_head;       // [V, H] when untied; null when tied

 private:
  parallel::TokenEmbeddingImpl& output_layer() { return lm_head ? *lm_head : *embed_tokens; }
};
TORCH_MODULE(LlamaForCausalLM);

}  // namespace kuafu::opt
