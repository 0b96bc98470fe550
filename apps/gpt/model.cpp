#include "apps/gpt/model.h"

#include <algorithm>
#include <cmath>

#include "core/nn/torch_init.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::gpt {

int64_t GPTConfig::parameter_count() const {
  const int64_t c = n_embd;
  const int64_t per_block = 2 * 2 * c + (c * 3 * c + 3 * c) + (c * c + c) + (c * 4 * c + 4 * c) + (4 * c * c + c);
  return vocab_size * c + n_positions * c + n_layer * per_block + 2 * c;
}

double GPTConfig::flops_per_token(int64_t t) const {
  return 6.0 * static_cast<double>(parameter_count()) + 12.0 * static_cast<double>(n_layer * n_embd * t);
}

nn::TransformerBlockSpec block_spec(const GPTConfig& c) {
  nn::TransformerBlockSpec spec;
  spec.hidden = c.n_embd;
  spec.heads = c.n_head;
  spec.intermediate = 4 * c.n_embd;
  spec.activation = nn::Activation::kGeluTanh;  // GPT-2's "gelu_new"
  spec.causal = true;
  spec.dropout = c.dropout;
  spec.attention_dropout = c.dropout;
  spec.norm_eps = c.layer_norm_epsilon;
  spec.weight_order = parallel::WeightOrder::kInOut;  // Conv1D
  nn::BlockNames& names = spec.names;
  names.norm_1 = "ln_1";
  names.qkv = "attn.c_attn";
  names.attention_out = "attn.c_proj";
  names.norm_2 = "ln_2";
  names.fc_in = "mlp.c_fc";
  names.fc_out = "mlp.c_proj";
  return spec;
}

TransformerImpl::TransformerImpl(const GPTConfig& config, const parallel::ModelOptions& options) {
  wte = register_module("wte", parallel::make_embedding(options, config.vocab_size, config.n_embd));
  wpe = parallel::make_position_embedding(options, config.n_positions, config.n_embd);
  register_module("wpe", wpe.ptr());
  drop = register_module("drop", torch::nn::Dropout(config.dropout));
  h = register_module("h", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < config.n_layer; ++i) {
    blocks.push_back(h->register_module(std::to_string(i), nn::TransformerBlock(block_spec(config), options)));
  }
  ln_f = parallel::make_layer_norm(options, config.n_embd, config.layer_norm_epsilon);
  register_module("ln_f", ln_f.ptr());
}

GPTImpl::GPTImpl(const GPTConfig& cfg, parallel::ModelOptions options)
    : config(cfg), device(options.device) {
  tp = options.tp;
  KUAFU_CHECK(cfg.n_embd % cfg.n_head == 0, "model.n_embd (", cfg.n_embd, ") must divide by model.n_head (",
              cfg.n_head, ")");
  KUAFU_CHECK(cfg.n_head % tp.feature_blocks() == 0, "model.n_head (", cfg.n_head, ") must divide by the ",
              tp.feature_blocks(), " blocks parallel.tensor.mode = \"", parallel::mode_name(tp.spec.mode),
              "\" cuts the heads into");
  transformer = register_module("transformer", Transformer(cfg, options));
  if (!options.device.is_meta()) initialize();
}

void GPTImpl::initialize() {
  // GPT-2 initialisation: N(0, 0.02) weights, zero biases, and residual projections scaled by
  // 1/sqrt(2 * n_layer) so the residual stream's variance does not grow with depth.
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  nn::initialize_like_transformers(
      *this, tp, [](const std::string& name) { return name.find("ln_") != std::string::npos && text::ends_with(name, ".weight"); },
      [residual_std](const std::string& name) { return name.find("c_proj.weight") != std::string::npos ? residual_std : 0.02; });
}

torch::Tensor GPTImpl::embed(const torch::Tensor& tokens, int64_t past) {
  const int64_t t = tokens.size(1);
  KUAFU_CHECK(past + t <= config.n_positions, "sequence of ", past + t, " tokens exceeds model.n_positions = ",
              config.n_positions);
  return embed_at(tokens, torch::arange(past, past + t, tokens.options().dtype(torch::kInt64)).unsqueeze(0));
}

torch::Tensor GPTImpl::embed_at(const torch::Tensor& tokens, const torch::Tensor& positions) {
  // [B, T] ids -> this rank's block of the stream; a [1, T] position embedding broadcasts over rows.
  return transformer->drop(transformer->wte->forward(tokens) + transformer->wpe.forward(positions));
}

hooks::ModelPart GPTImpl::block_part(int64_t i) const {
  const std::string path = "transformer.h." + std::to_string(i);
  return {path, {path}};
}


torch::Tensor GPTImpl::local_logits(const torch::Tensor& x) {
  return transformer->wte->logits(final_hidden(x));  // the tied output layer
}

torch::Tensor GPTImpl::tail_loss(const torch::Tensor& x, const torch::Tensor& targets) {
  return nn::tied_output_loss(*transformer->wte, final_hidden(x), targets);
}

torch::Tensor GPTImpl::tail_sums(const torch::Tensor& x, const torch::Tensor& targets) {
  return nn::token_loss_sums(tail_loss(x, targets), targets);
}

torch::Tensor GPTImpl::forward(const torch::Tensor& tokens, std::vector<ops::KVCache>* caches) {
  const int64_t past = caches && !caches->empty() ? (*caches)[0].length() : 0;
  return output_logits(nn::run_blocks(transformer->blocks, embed(tokens, past), caches));
}

nn::Decoder decoder(GPT& model) { return nn::decoder_of(model.ptr()); }

}  // namespace kuafu::gpt
