#include "apps/stable_diffusion/clip_text_model.h"

#include <cmath>

#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::sd {

void ClipTextConfig::validate() const {
  KUAFU_CHECK(vocab_size > 0 && hidden_size > 0 && intermediate_size > 0 && num_hidden_layers > 0 && num_attention_heads > 0 &&
                  max_position_embeddings > 0,
              "CLIP's sizes (vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
              "max_position_embeddings) must be positive");
  KUAFU_CHECK(!with_projection || projection_dim > 0, "CLIPTextModelWithProjection's projection_dim (", projection_dim,
              ") must be positive");
  KUAFU_CHECK(hidden_size % num_attention_heads == 0, "hidden_size (", hidden_size, ") must divide by num_attention_heads (",
              num_attention_heads, ")");
}

int64_t ClipTextConfig::parameter_count() const {
  const int64_t h = hidden_size, f = intermediate_size;
  const int64_t per_layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h;  // attention, MLP, two norms
  return (vocab_size + max_position_embeddings) * h + num_hidden_layers * per_layer + 2 * h + (with_projection ? h * projection_dim : 0);
}

nn::TransformerBlockSpec block_spec(const ClipTextConfig& c) {
  nn::TransformerBlockSpec spec;
  spec.hidden = c.hidden_size;
  spec.heads = c.num_attention_heads;
  spec.intermediate = c.intermediate_size;
  spec.activation = c.hidden_act;
  spec.causal = true;
  spec.norm_eps = c.layer_norm_eps;
  nn::BlockNames& names = spec.names;
  names.norm_1 = "layer_norm1";
  names.q = "self_attn.q_proj";
  names.k = "self_attn.k_proj";
  names.v = "self_attn.v_proj";
  names.attention_out = "self_attn.out_proj";
  names.norm_2 = "layer_norm2";
  names.fc_in = "mlp.fc1";
  names.fc_out = "mlp.fc2";
  return spec;
}

ClipEmbeddingsImpl::ClipEmbeddingsImpl(const ClipTextConfig& c, const parallel::ModelOptions& options) {
  token_embedding = register_module("token_embedding", parallel::make_embedding(options, c.vocab_size, c.hidden_size));
  position_embedding = parallel::make_position_embedding(options, c.max_position_embeddings, c.hidden_size);
  register_module("position_embedding", position_embedding.ptr());
}

ClipTextModelImpl::ClipTextModelImpl(const ClipTextConfig& c, parallel::ModelOptions options) : config(c), tp(options.tp) {
  c.validate();
  text_model = register_module("text_model", std::make_shared<torch::nn::Module>()).get();
  embeddings = text_model->register_module("embeddings", ClipEmbeddings(c, options));
  auto encoder = text_model->register_module("encoder", std::make_shared<torch::nn::Module>());
  layers = encoder->register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    blocks.push_back(layers->register_module(std::to_string(i), nn::TransformerBlock(block_spec(c), options)));
  }
  final_layer_norm = parallel::make_layer_norm(options, c.hidden_size, c.layer_norm_eps);
  text_model->register_module("final_layer_norm", final_layer_norm.ptr());
  if (c.with_projection) {
    text_projection = register_module(
        "text_projection", parallel::SerialLinear(parallel::LinearSpec{c.hidden_size, c.projection_dim, /*bias=*/false}, options.device));
  }
  if (!options.device.is_meta()) initialize();
}

void ClipTextModelImpl::initialize() {
  // transformers' initialisation: N(0, 0.02) embeddings and projections, zero biases, unit LayerNorms.
  const double projection_std = 1.0 / std::sqrt(static_cast<double>(config.hidden_size));
  parallel::initialize_like_serial(*this, tp, [projection_std](const std::string& name, torch::Tensor& full) {
    if (name.rfind("text_projection", 0) == 0) {
      full.normal_(0.0, projection_std);  // transformers: hidden_size^-0.5
    } else if (name.find("layer_norm") != std::string::npos) {
      full.fill_(text::ends_with(name, ".weight") ? 1.0 : 0.0);
    } else if (text::ends_with(name, ".bias")) {
      full.zero_();
    } else {
      full.normal_(0.0, 0.02);
    }
    return true;
  });
}

torch::Tensor ClipTextModelImpl::embed_tokens(const torch::Tensor& ids, const torch::Tensor& added_rows) {
  if (!added_rows.defined()) return embeddings->token_embedding->forward(ids);
  KUAFU_CHECK(added_rows.dim() == 2 && added_rows.size(1) == config.hidden_size, "added token embeddings of shape ", added_rows.sizes(),
              " are not [n, ", config.hidden_size, "] (the text encoder's hidden_size)");
  const int64_t largest = ids.max().item<int64_t>();
  KUAFU_CHECK(largest < config.vocab_size + added_rows.size(0), "token id ", largest, " is past the vocabulary (", config.vocab_size,
              ") and the ", added_rows.size(0), " added tokens");
  const torch::Tensor added = ids >= config.vocab_size;                                       // [B, T]
  const torch::Tensor known = embeddings->token_embedding->forward(ids.masked_fill(added, 0));  // [B, T, D]
  const torch::Tensor learned =
      torch::nn::functional::embedding((ids - config.vocab_size).clamp_min(0), added_rows).to(known.scalar_type());  // [B, T, D]
  return torch::where(added.unsqueeze(-1), learned, known);
}

ClipTextModelImpl::Output ClipTextModelImpl::forward(const torch::Tensor& ids, const torch::Tensor& added_rows) {
  const int64_t t = ids.size(1);
  KUAFU_CHECK(t <= config.max_position_embeddings, "a prompt of ", t, " tokens exceeds CLIP's ", config.max_position_embeddings,
              " positions");
  const torch::Tensor positions = torch::arange(t, ids.options().dtype(torch::kInt64)).unsqueeze(0);  // [1, T]
  torch::Tensor x = embed_tokens(ids, added_rows) + embeddings->position_embedding.forward(positions);  // [B, T, D]
  Output out;
  for (nn::TransformerBlock& block : blocks) {
    out.penultimate = x;
    x = block->forward(x);
  }
  out.last_hidden = final_layer_norm.forward(x);
  // Each row's end-of-text position [B]: the highest id under old configs, else the first eos_token_id.
  const torch::Tensor end = config.eos_token_id == 2 ? ids.argmax(-1) : (ids == config.eos_token_id).to(torch::kInt64).argmax(-1);
  out.pooled = out.last_hidden.gather(1, end.view({-1, 1, 1}).expand({-1, 1, out.last_hidden.size(2)})).squeeze(1);
  if (text_projection) out.text_embeds = text_projection(out.pooled);
  return out;
}

}  // namespace kuafu::sd
