#include "apps/opt_finetune/model_llama.h"

#include "core/nn/torch_init.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::opt {

std::string LlamaConfig::family() const {
  if (model_type == "qwen2") return "Qwen2";
  if (model_type == "qwen3") return "Qwen3";
  if (model_type == "mistral") return "Mistral";
  return "Llama";
}

std::string LlamaConfig::architecture() const { return family() + "ForCausalLM"; }

int64_t LlamaConfig::parameter_count() const {
  const int64_t h = hidden_size, q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  const int64_t attention = h * (q + 2 * kv) + q * h + (qkv_bias() ? q + 2 * kv : 0) + (out_bias() ? h : 0) +
                            (qk_norm() ? 2 * head_dim : 0);
  const int64_t mlp = 3 * h * intermediate_size + (mlp_bias ? 2 * intermediate_size + h : 0);
  return vocab_size * h * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * (attention + mlp + 2 * h) + h;
}

double LlamaConfig::flops_per_token(int64_t t) const {
  return 6.0 * static_cast<double>(parameter_count()) +
         12.0 * static_cast<double>(num_hidden_layers * num_attention_heads * head_dim * t);
}

void LlamaConfig::validate() const {
  KUAFU_CHECK(vocab_size > 0 && hidden_size > 0 && intermediate_size > 0 && num_hidden_layers > 0 && num_attention_heads > 0 &&
                  num_key_value_heads > 0 && head_dim > 0 && max_position_embeddings > 0,
              "the sizes (vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
              "num_key_value_heads, head_dim, max_position_embeddings) must be positive");
  KUAFU_CHECK(num_attention_heads % num_key_value_heads == 0, "num_attention_heads (", num_attention_heads,
              ") must divide by num_key_value_heads (", num_key_value_heads, ")");
  KUAFU_CHECK(rms_norm_eps > 0, "rms_norm_eps must be positive, found ", rms_norm_eps);
  KUAFU_CHECK(sliding_window >= 0, "sliding_window must not be negative, found ", sliding_window);
  KUAFU_CHECK(sliding_layers.empty() || static_cast<int64_t>(sliding_layers.size()) == num_hidden_layers,
              "layer_types names ", sliding_layers.size(), " layers of ", num_hidden_layers);
  nn::validate(rope, "");
}

nn::TransformerBlockSpec block_spec(const LlamaConfig& c, int64_t layer) {
  nn::TransformerBlockSpec spec;
  spec.hidden = c.hidden_size;
  spec.heads = c.num_attention_heads;
  spec.kv_heads = c.num_key_value_heads;
  spec.head_dim = c.head_dim;
  spec.intermediate = c.intermediate_size;
  spec.activation = nn::Activation::kSilu;
  spec.gated_mlp = true;
  spec.rms_norm = true;
  spec.causal = true;
  spec.attention_dropout = c.attention_dropout;
  spec.norm_eps = c.rms_norm_eps;
  spec.qkv_bias = c.qkv_bias();
  spec.out_bias = c.out_bias();
  spec.mlp_bias = c.mlp_bias;
  spec.qk_norm = c.qk_norm();
  spec.rotary = c.rope;
  const bool slides = c.sliding_layers.empty() || c.sliding_layers[static_cast<size_t>(layer)];
  spec.window = slides ? c.sliding_window : 0;
  nn::BlockNames& names = spec.names;
  names.norm_1 = "input_layernorm";
  names.q = "self_attn.q_proj";
  names.k = "self_attn.k_proj";
  names.v = "self_attn.v_proj";
  names.q_norm = "self_attn.q_norm";
  names.k_norm = "self_attn.k_norm";
  names.attention_out = "self_attn.o_proj";
  names.norm_2 = "post_attention_layernorm";
  names.fc_gate = "mlp.gate_proj";
  names.fc_in = "mlp.up_proj";
  names.fc_out = "mlp.down_proj";
  return spec;
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c, parallel::ModelOptions options) : config(c) {
  tp = options.tp;
  c.validate();
  model = register_module("model", std::make_shared<torch::nn::Module>()).get();
  embed_tokens = model->register_module("embed_tokens", parallel::make_embedding(options, c.vocab_size, c.hidden_size));
  const auto layers = model->register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    blocks.push_back(layers->register_module(std::to_string(i), nn::TransformerBlock(block_spec(c, i), options)));
  }
  norm = parallel::make_rms_norm(options, c.hidden_size, c.rms_norm_eps);
  model->register_module("norm", norm.ptr());
  if (!c.tie_word_embeddings) lm_head = register_module("lm_head", parallel::make_embedding(options, c.vocab_size, c.hidden_size));
  if (!options.device.is_meta()) initialize();
}

void LlamaForCausalLMImpl::initialize() {
  // N(0, 0.02) weights (embeddings, lm_head), zero biases, RMSNorms at one.
  nn::initialize_like_transformers(
      *this, tp, [](const std::string& name) { return text::ends_with(name, "norm.weight"); },
      [](const std::string&) { return 0.02; });
}

hooks::ModelPart LlamaForCausalLMImpl::head_part() const { return {"model.embed", {"model.embed_tokens"}}; }

hooks::ModelPart LlamaForCausalLMImpl::block_part(int64_t i) const {
  const std::string path = "model.layers." + std::to_string(i);
  return {path, {path}};
}

hooks::ModelPart LlamaForCausalLMImpl::tail_part() const {
  return {"model.head", {"model.norm", config.tie_word_embeddings ? "model.embed_tokens" : "lm_head"}};
}

torch::Tensor LlamaForCausalLMImpl::embed_at(const torch::Tensor& tokens, const torch::Tensor& /*positions*/) {
  return embed_tokens->forward(tokens);
}

torch::Tensor LlamaForCausalLMImpl::output_logits(const torch::Tensor& x) {
  parallel::TokenEmbeddingImpl& head = output_layer();
  return head.gather_logits(head.logits(final_hidden(x)));
}

torch::Tensor LlamaForCausalLMImpl::tail_loss(const torch::Tensor& x, const torch::Tensor& targets) {
  return nn::tied_output_loss(output_layer(), final_hidden(x), targets);
}

torch::Tensor LlamaForCausalLMImpl::tail_sums(const torch::Tensor& x, const torch::Tensor& targets) {
  return nn::token_loss_sums(tail_loss(x, targets), targets);
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& inputs) {
  return output_logits(nn::run_blocks(blocks, head(inputs), nullptr, ops::AttentionMask({}, block_context(inputs))));
}

}  // namespace kuafu::opt
