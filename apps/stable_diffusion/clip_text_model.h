// CLIP's text encoder (transformers' CLIPTextModel) under its own names: token and position embeddings,
// causal pre-LN blocks (quick GELU or exact GELU, from the config), the final layer norm, and the pooled
// output at each row's end-of-text token; CLIPTextModelWithProjection adds text_projection of the pooled
// output. Stable Diffusion reads the last hidden states (SD 2.x's encoder simply has one layer fewer: the
// config says which layer is last); SDXL reads the penultimate layer's and the projected pooled output.
#pragma once

#include <string>
#include <vector>

#include "core/nn/transformer_block.h"
#include "core/parallel/tensor/factory.h"

namespace kuafu::sd {

// Field names follow transformers' CLIPTextConfig (SD 1.x's values as defaults).
struct ClipTextConfig {
  int64_t vocab_size = 49408;
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t max_position_embeddings = 77;
  nn::Activation hidden_act = nn::Activation::kQuickGelu;  // "quick_gelu" (SD 1.x) or "gelu" (SD 2.x)
  double layer_norm_eps = 1e-5;
  // 2 (configs before transformers 4.31): the pooled output is at each row's highest id, as it was then;
  // otherwise at the row's first eos_token_id.
  int64_t eos_token_id = 2;
  // CLIPTextModelWithProjection (config.json's architectures): text_projection [projection_dim, hidden_size].
  bool with_projection = false;
  int64_t projection_dim = 512;

  void validate() const;  // kuafu::Error naming the field
  int64_t parameter_count() const;
};

struct ClipEmbeddingsImpl : torch::nn::Module {
  ClipEmbeddingsImpl(const ClipTextConfig& config, const parallel::ModelOptions& options);
  std::shared_ptr<parallel::TokenEmbeddingImpl> token_embedding;  // [V, D]
  torch::nn::AnyModule position_embedding;                        // [P, D]
};
TORCH_MODULE(ClipEmbeddings);

struct ClipTextModelImpl : torch::nn::Module {
  // Made on options.device and initialised; on torch::kMeta described only (lazy construction).
  explicit ClipTextModelImpl(const ClipTextConfig& config, parallel::ModelOptions options = {});
  void initialize();  // transformers' draws from the current seed

  struct Output {
    torch::Tensor last_hidden;  // [B, T, D], after the final layer norm
    torch::Tensor pooled;       // [B, D] at each row's end-of-text token
    torch::Tensor penultimate;  // [B, T, D]: transformers' hidden_states[-2], the last layer's input (no final norm)
    torch::Tensor text_embeds;  // [B, projection_dim]: the pooled output projected (with_projection only)
  };
  // ids [B, T], T <= max_position_embeddings; ids from vocab_size on read the rows of `added_rows` [n, D] in
  // order (textual inversion's tokens, as transformers' resize_token_embeddings appends them), which the
  // gradients reach.
  Output forward(const torch::Tensor& ids, const torch::Tensor& added_rows = {});

  // [B, T, D]: each id's token embedding, an added one's from `added_rows`.
  torch::Tensor embed_tokens(const torch::Tensor& ids, const torch::Tensor& added_rows);

  ClipTextConfig config;
  parallel::TensorParallel tp;
  torch::nn::Module* text_model = nullptr;  // "text_model", transformers' nesting
  ClipEmbeddings embeddings{nullptr};
  std::shared_ptr<torch::nn::Module> layers;  // "encoder.layers", children "0" .. "L-1"
  std::vector<nn::TransformerBlock> blocks;
  torch::nn::AnyModule final_layer_norm;
  parallel::SerialLinear text_projection{nullptr};  // "text_projection", no bias (with_projection only)
};
TORCH_MODULE(ClipTextModel);

nn::TransformerBlockSpec block_spec(const ClipTextConfig& config);

}  // namespace kuafu::sd
