#include "apps/opt_finetune/model.h"

#include "core/nn/torch_init.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::opt {

int64_t OPTConfig::parameter_count() const {
  const int64_t h = hidden_size, f = ffn_dim;
  const int64_t per_block = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h;
  return vocab_size * word_embed_proj_dim + (max_position_embeddings + kPositionOffset) * h +
         (projects() ? 2 * h * word_embed_proj_dim : 0) + num_hidden_layers * per_block +
         (has_final_layer_norm() ? 2 * h : 0);
}

double OPTConfig::flops_per_token(int64_t t) const {
  return 6.0 * static_cast<double>(parameter_count()) + 12.0 * static_cast<double>(num_hidden_layers * hidden_size * t);
}

void OPTConfig::validate() const {
  KUAFU_CHECK(vocab_size > 0 && hidden_size > 0 && num_hidden_layers > 0 && ffn_dim > 0 && num_attention_heads > 0 &&
                  max_position_embeddings > 0 && word_embed_proj_dim > 0,
              "OPT's sizes (vocab_size, hidden_size, num_hidden_layers, ffn_dim, num_attention_heads, "
              "max_position_embeddings, word_embed_proj_dim) must be positive");
  KUAFU_CHECK(hidden_size % num_attention_heads == 0, "hidden_size (", hidden_size, ") must divide by num_attention_heads (",
              num_attention_heads, ")");
}

nn::TransformerBlockSpec block_spec(const OPTConfig& c) {
  nn::TransformerBlockSpec spec;
  spec.hidden = c.hidden_size;
  spec.heads = c.num_attention_heads;
  spec.intermediate = c.ffn_dim;
  spec.activation = nn::Activation::kRelu;
  spec.pre_norm = c.do_layer_norm_before;
  spec.causal = true;
  spec.dropout = c.dropout;
  spec.attention_dropout = c.attention_dropout;
  spec.norm_eps = c.layer_norm_eps;
  nn::BlockNames& names = spec.names;
  names.norm_1 = "self_attn_layer_norm";
  names.q = "self_attn.q_proj";
  names.k = "self_attn.k_proj";
  names.v = "self_attn.v_proj";
  names.attention_out = "self_attn.out_proj";
  names.norm_2 = "final_layer_norm";
  names.fc_in = "fc1";
  names.fc_out = "fc2";
  return spec;
}

DecoderImpl::DecoderImpl(const OPTConfig& c, const parallel::ModelOptions& options) {
  embed_tokens = register_module("embed_tokens", parallel::make_embedding(options, c.vocab_size, c.word_embed_proj_dim));
  embed_positions = parallel::make_position_embedding(options, c.max_position_embeddings + OPTConfig::kPositionOffset, c.hidden_size);
  register_module("embed_positions", embed_positions.ptr());
  if (c.projects()) {
    // The projections take and give whole features: a tensor-parallel stream would need cut versions.
    KUAFU_CHECK(!options.tp.enabled(), "OPT with word_embed_proj_dim != hidden_size (opt-350m) runs without tensor parallelism");
    auto linear = [&](int64_t in, int64_t out) {
      return parallel::make_linear(options, {in, out, /*bias=*/false, parallel::WeightOrder::kOutIn}, parallel::Cut::kColumn);
    };
    project_in = linear(c.word_embed_proj_dim, c.hidden_size);
    project_out = linear(c.hidden_size, c.word_embed_proj_dim);
    register_module("project_in", project_in.ptr());
    register_module("project_out", project_out.ptr());
  }
  layers = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    blocks.push_back(layers->register_module(std::to_string(i), nn::TransformerBlock(block_spec(c), options)));
  }
  if (c.has_final_layer_norm()) {
    final_layer_norm = parallel::make_layer_norm(options, c.hidden_size, c.layer_norm_eps);
    register_module("final_layer_norm", final_layer_norm.ptr());
  }
  dropout = register_module("dropout", torch::nn::Dropout(c.dropout));
}

OPTForCausalLMImpl::OPTForCausalLMImpl(const OPTConfig& c, parallel::ModelOptions options)
    : config(c), device(options.device) {
  tp = options.tp;
  c.validate();
  KUAFU_CHECK(c.num_attention_heads % tp.feature_blocks() == 0, "num_attention_heads (", c.num_attention_heads,
              ") must divide by the ", tp.feature_blocks(), " blocks parallel.tensor.mode = \"",
              parallel::mode_name(tp.spec.mode), "\" cuts the heads into");
  model = register_module("model", std::make_shared<torch::nn::Module>()).get();
  decoder = model->register_module("decoder", Decoder(c, options));
  if (!options.device.is_meta()) initialize();
}

void OPTForCausalLMImpl::initialize() {
  // Hugging Face's OPT initialisation: N(0, 0.02) weights (positions included), zero biases, LayerNorms
  // at ones and zeros.
  nn::initialize_like_transformers(
      *this, tp,
      [](const std::string& name) { return name.find("layer_norm") != std::string::npos && text::ends_with(name, ".weight"); },
      [](const std::string&) { return 0.02; });
}

hooks::ModelPart OPTForCausalLMImpl::head_part() const {
  std::vector<std::string> modules = {"model.decoder.embed_tokens", "model.decoder.embed_positions"};
  if (config.projects()) modules.push_back("model.decoder.project_in");
  return {"model.decoder.embed", modules};
}

hooks::ModelPart OPTForCausalLMImpl::block_part(int64_t i) const {
  const std::string path = "model.decoder.layers." + std::to_string(i);
  return {path, {path}};
}

std::vector<std::string> OPTForCausalLMImpl::final_modules() const {
  std::vector<std::string> modules;
  if (config.has_final_layer_norm()) modules.push_back("model.decoder.final_layer_norm");
  if (config.projects()) modules.push_back("model.decoder.project_out");
  return modules;
}

hooks::ModelPart OPTForCausalLMImpl::tail_part() const {
  std::vector<std::string> modules = final_modules();
  modules.insert(modules.begin(), "model.decoder.embed_tokens");
  return {"model.decoder.head", modules};
}

torch::Tensor OPTForCausalLMImpl::embed_at(const torch::Tensor& tokens, const torch::Tensor& positions) {
  torch::Tensor x = decoder->embed_tokens->forward(tokens);
  if (config.projects()) x = decoder->project_in.forward(x);
  return decoder->dropout(x + decoder->embed_positions.forward(positions + OPTConfig::kPositionOffset));
}


torch::Tensor OPTForCausalLMImpl::final_hidden(const torch::Tensor& x) {
  torch::Tensor h = config.has_final_layer_norm() ? decoder->final_layer_norm.forward(x) : x;
  return config.projects() ? decoder->project_out.forward(h) : h;
}

torch::Tensor OPTForCausalLMImpl::local_logits(const torch::Tensor& x) { return decoder->embed_tokens->logits(final_hidden(x)); }

torch::Tensor OPTForCausalLMImpl::output_logits(const torch::Tensor& x) {
  return decoder->embed_tokens->gather_logits(local_logits(x));
}

torch::Tensor OPTForCausalLMImpl::tail_loss(const torch::Tensor& x, const torch::Tensor& targets) {
  return nn::tied_output_loss(*decoder->embed_tokens, final_hidden(x), targets);
}

torch::Tensor OPTForCausalLMImpl::tail_sums(const torch::Tensor& x, const torch::Tensor& targets) {
  return nn::token_loss_sums(tail_loss(x, targets), targets);
}

torch::Tensor OPTForCausalLMImpl::forward(const torch::Tensor& inputs) {
  const torch::Tensor x = head(inputs);
  return output_logits(nn::run_blocks(decoder->blocks, x, nullptr, ops::AttentionMask({}, block_context(inputs))));
}

nn::Decoder decoder(OPTForCausalLM& model) { return nn::decoder_of(model.ptr()); }

}  // namespace kuafu::opt
