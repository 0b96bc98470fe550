#include "apps/vit/model.h"

#include <cmath>

#include "core/nn/attention.h"
#include "core/util/error.h"

namespace kuafu::vit {

int64_t ViTConfig::parameter_count() const {
  const int64_t h = hidden_size, i = intermediate_size;
  const int64_t embeddings = h * num_channels * patch_size * patch_size + h + h + sequence_length() * h;
  const int64_t layer = 4 * (h * h + h) + 2 * h * i + i + h + 4 * h;
  return embeddings + num_hidden_layers * layer + 2 * h + h * num_labels + num_labels;
}

double ViTConfig::flops_per_image() const {
  const double h = static_cast<double>(hidden_size), t = static_cast<double>(sequence_length());
  const double per_token = static_cast<double>(num_hidden_layers) * (4 * h * h + 2 * h * static_cast<double>(intermediate_size));
  const double patches = static_cast<double>(num_patches()) * h * static_cast<double>(num_channels * patch_size * patch_size);
  const double attention = 12.0 * static_cast<double>(num_hidden_layers) * h * t * t;
  return 6.0 * (per_token * t + patches + h * static_cast<double>(num_labels)) + attention;
}

void ViTConfig::validate() const {
  KUAFU_CHECK(image_size > 0 && patch_size > 0 && image_size % patch_size == 0, "model.patch_size (", patch_size,
              ") must divide model.image_size (", image_size, ")");
  KUAFU_CHECK(hidden_size % num_attention_heads == 0, "model.hidden_size (", hidden_size,
              ") must divide by model.num_attention_heads (", num_attention_heads, ")");
  KUAFU_CHECK(num_labels > 0 && num_channels > 0 && num_hidden_layers > 0 && intermediate_size > 0,
              "model.num_labels, num_channels, num_hidden_layers and intermediate_size must be positive");
}

namespace {

parallel::LinearSpec linear(int64_t in, int64_t out) {
  return parallel::LinearSpec{in, out, /*bias=*/true, parallel::WeightOrder::kOutIn, /*stride=*/1};
}

// Truncated normal on [−2σ, 2σ] by inverting the normal CDF on the matching uniform range (as
// PyTorch's trunc_normal_ does), so no value is clipped.
void truncated_normal_(torch::Tensor& t, double std) {
  const double low = std::erf(-2.0 / std::sqrt(2.0)), high = std::erf(2.0 / std::sqrt(2.0));
  t.uniform_(low, high).erfinv_().mul_(std * std::sqrt(2.0));
}

}  // namespace

PatchEmbeddingsImpl::PatchEmbeddingsImpl(const ViTConfig& c, const torch::Device& device) : patch_size(c.patch_size) {
  const auto on = torch::TensorOptions().device(device);
  projection = register_module("projection", std::make_shared<torch::nn::Module>());
  weight = projection->register_parameter("weight", torch::zeros({c.hidden_size, c.num_channels, c.patch_size, c.patch_size}, on));
  bias = projection->register_parameter("bias", torch::zeros({c.hidden_size}, on));
}

torch::Tensor PatchEmbeddingsImpl::forward(const torch::Tensor& pixels) {
  const torch::Tensor features = torch::conv2d(pixels, weight, bias, /*stride=*/{patch_size, patch_size});
  return features.flatten(2).transpose(1, 2);  // [B, H, S/P, S/P] -> [B, N, H]
}

EmbeddingsImpl::EmbeddingsImpl(const ViTConfig& c, const torch::Device& device) {
  const auto on = torch::TensorOptions().device(device);
  cls_token = register_parameter("cls_token", torch::zeros({1, 1, c.hidden_size}, on));
  position_embeddings = register_parameter("position_embeddings", torch::zeros({1, c.sequence_length(), c.hidden_size}, on));
  patch_embeddings = register_module("patch_embeddings", PatchEmbeddings(c, device));
  dropout = register_module("dropout", torch::nn::Dropout(c.hidden_dropout_prob));
}

torch::Tensor EmbeddingsImpl::forward(const torch::Tensor& pixels) {
  torch::Tensor patches = patch_embeddings(pixels);
  torch::Tensor cls = cls_token.expand({patches.size(0), 1, cls_token.size(2)});
  return dropout(torch::cat({cls, patches}, 1) + position_embeddings);
}

SelfAttentionImpl::SelfAttentionImpl(const ViTConfig& c, const parallel::TensorParallel& tp)
    : heads(c.num_attention_heads / tp.feature_blocks()), dropout(c.attention_probs_dropout_prob) {
  KUAFU_CHECK(c.num_attention_heads % tp.feature_blocks() == 0, "model.num_attention_heads (", c.num_attention_heads,
              ") must divide by the ", tp.feature_blocks(), " blocks parallel.tensor.mode = \"",
              parallel::mode_name(tp.spec.mode), "\" cuts the heads into");
  query = parallel::make_linear(tp, linear(c.hidden_size, c.hidden_size), parallel::Cut::kColumn);
  key = parallel::make_linear(tp, linear(c.hidden_size, c.hidden_size), parallel::Cut::kColumn);
  value = parallel::make_linear(tp, linear(c.hidden_size, c.hidden_size), parallel::Cut::kColumn);
  register_module("query", query.ptr());
  register_module("key", key.ptr());
  register_module("value", value.ptr());
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1);
  auto split_heads = [&](const torch::Tensor& y) {  // [B, T, h d] -> [B, h, T, d]
    return y.view({b, t, heads, y.size(2) / heads}).transpose(1, 2);
  };
  torch::Tensor y = nn::scaled_dot_product_attention(split_heads(query.forward(x)), split_heads(key.forward(x)),
                                                     split_heads(value.forward(x)), /*causal=*/false,
                                                     is_training() ? dropout : 0.0);
  return y.transpose(1, 2).reshape({b, t, -1});
}

DenseImpl::DenseImpl(const parallel::TensorParallel& tp, int64_t in, int64_t out, parallel::Cut cut) {
  dense = parallel::make_linear(tp, linear(in, out), cut);
  register_module("dense", dense.ptr());
}

AttentionImpl::AttentionImpl(const ViTConfig& c, const parallel::TensorParallel& tp) {
  attention = register_module("attention", SelfAttention(c, tp));
  output = register_module("output", Dense(tp, c.hidden_size, c.hidden_size, parallel::Cut::kRow));
}

LayerImpl::LayerImpl(const ViTConfig& c, const parallel::TensorParallel& tp) {
  attention = register_module("attention", Attention(c, tp));
  intermediate = register_module("intermediate", Dense(tp, c.hidden_size, c.intermediate_size, parallel::Cut::kColumn));
  output = register_module("output", Dense(tp, c.intermediate_size, c.hidden_size, parallel::Cut::kRow));
  layernorm_before = parallel::make_layer_norm(tp, c.hidden_size, c.layer_norm_eps);
  register_module("layernorm_before", layernorm_before.ptr());
  layernorm_after = parallel::make_layer_norm(tp, c.hidden_size, c.layer_norm_eps);
  register_module("layernorm_after", layernorm_after.ptr());
  dropout = register_module("dropout", torch::nn::Dropout(c.hidden_dropout_prob));
}

torch::Tensor LayerImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = x + dropout(attention(layernorm_before.forward(x)));
  return h + dropout(output(torch::gelu(intermediate(layernorm_after.forward(h)))));
}

ViTModelImpl::ViTModelImpl(const ViTConfig& c, const parallel::TensorParallel& tp) {
  embeddings = register_module("embeddings", Embeddings(c, tp.device));
  encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  auto list = encoder->register_module("layer", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers.push_back(list->register_module(std::to_string(i), Layer(c, tp)));
  layernorm = parallel::make_layer_norm(tp, c.hidden_size, c.layer_norm_eps);
  register_module("layernorm", layernorm.ptr());
}

ViTForImageClassificationImpl::ViTForImageClassificationImpl(const ViTConfig& c, parallel::TensorParallel tensor_parallel)
    : config(c), tp(std::move(tensor_parallel)) {
  config.validate();
  vit = register_module("vit", ViTModel(config, tp));
  classifier = parallel::make_linear(tp, linear(config.hidden_size, config.num_labels), parallel::Cut::kColumn);
  register_module("classifier", classifier.ptr());
  // Hugging Face's initialisation: truncated normal (σ = 0.02) weights, class token and positions;
  // zero biases; LayerNorm ones and zeros.
  parallel::initialize_like_serial(*this, tp, [](const std::string& name, torch::Tensor& full) {
    if (name.find("layernorm") != std::string::npos) return false;
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      full.zero_();
    } else {
      truncated_normal_(full, 0.02);
    }
    return true;
  });
}

torch::Tensor ViTForImageClassificationImpl::forward(const torch::Tensor& pixels) {
  KUAFU_CHECK(pixels.dim() == 4 && pixels.size(1) == config.num_channels && pixels.size(2) == config.image_size &&
                  pixels.size(3) == config.image_size,
              "ViT expects pixels [B, ", config.num_channels, ", ", config.image_size, ", ", config.image_size,
              "], got ", pixels.sizes());
  // The embeddings run whole on every rank of a tensor group; the blocks take the mode's cut of them.
  torch::Tensor x = parallel::enter_stream(tp, vit->embeddings(pixels));
  for (auto& layer : vit->layers) x = layer(x);
  x = vit->layernorm.forward(x);
  return parallel::gather_classifier_logits(tp, classifier.forward(x.select(1, 0)));  // the class token
}

torch::Tensor ViTForImageClassificationImpl::loss(const torch::Tensor& pixels, const torch::Tensor& soft_targets) {
  const torch::Tensor logits = forward(pixels).to(torch::kFloat32);
  return -(soft_targets.to(logits.scalar_type()) * torch::log_softmax(logits, -1)).sum(-1).mean();
}

torch::Tensor smoothed_targets(const torch::Tensor& labels, int64_t classes, double smoothing) {
  KUAFU_CHECK(smoothing >= 0 && smoothing < 1, "label smoothing must be in [0, 1), got ", smoothing);
  KUAFU_CHECK(labels.numel() == 0 || (labels.min().item<int64_t>() >= 0 && labels.max().item<int64_t>() < classes),
              "labels must lie in [0, ", classes, ")");
  const auto options = torch::TensorOptions().device(labels.device());
  torch::Tensor targets = torch::full({labels.size(0), classes}, smoothing / static_cast<double>(classes), options);
  return targets.scatter_add_(1, labels.unsqueeze(1), torch::full({labels.size(0), 1}, 1.0 - smoothing, options));
}

}  // namespace kuafu::vit
