#include "apps/vit/model.h"

#include <cmath>

#include "core/util/error.h"
#include "core/util/text.h"

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

nn::TransformerBlockSpec block_spec(const ViTConfig& c) {
  nn::TransformerBlockSpec spec;
  spec.hidden = c.hidden_size;
  spec.heads = c.num_attention_heads;
  spec.intermediate = c.intermediate_size;
  spec.activation = nn::Activation::kGelu;
  spec.dropout = c.hidden_dropout_prob;
  spec.attention_dropout = c.attention_probs_dropout_prob;
  spec.norm_eps = c.layer_norm_eps;
  nn::BlockNames& names = spec.names;
  names.norm_1 = "layernorm_before";
  names.q = "attention.attention.query";
  names.k = "attention.attention.key";
  names.v = "attention.attention.value";
  names.attention_out = "attention.output.dense";
  names.norm_2 = "layernorm_after";
  names.fc_in = "intermediate.dense";
  names.fc_out = "output.dense";
  return spec;
}

ViTModelImpl::ViTModelImpl(const ViTConfig& c, const parallel::ModelOptions& options) {
  embeddings = register_module("embeddings", Embeddings(c, options.device));
  encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  auto list = encoder->register_module("layer", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers.push_back(list->register_module(std::to_string(i), nn::TransformerBlock(block_spec(c), options)));
  }
  layernorm = parallel::make_layer_norm(options, c.hidden_size, c.layer_norm_eps);
  register_module("layernorm", layernorm.ptr());
}

ViTForImageClassificationImpl::ViTForImageClassificationImpl(const ViTConfig& c, parallel::ModelOptions options)
    : config(c), tp(options.tp) {
  config.validate();
  KUAFU_CHECK(config.num_attention_heads % tp.feature_blocks() == 0, "model.num_attention_heads (",
              config.num_attention_heads, ") must divide by the ", tp.feature_blocks(), " blocks parallel.tensor.mode = \"",
              parallel::mode_name(tp.spec.mode), "\" cuts the heads into");
  vit = register_module("vit", ViTModel(config, options));
  classifier = parallel::make_linear(options, linear(config.hidden_size, config.num_labels), parallel::Cut::kColumn);
  register_module("classifier", classifier.ptr());
  if (!options.device.is_meta()) initialize();
}

void ViTForImageClassificationImpl::initialize() {
  // Hugging Face's initialisation: truncated normal (σ = 0.02) weights, class token and positions;
  // zero biases; LayerNorm ones and zeros.
  parallel::initialize_like_serial(*this, tp, [](const std::string& name, torch::Tensor& full) {
    if (name.find("layernorm") != std::string::npos && text::ends_with(name, ".weight")) {
      full.fill_(1.0);
    } else if (text::ends_with(name, ".bias")) {
      full.zero_();
    } else {
      truncated_normal_(full, 0.02);
    }
    return true;
  });
}

hooks::ModelPart ViTForImageClassificationImpl::block_part(int64_t i) const {
  const std::string path = "vit.encoder.layer." + std::to_string(i);
  return {path, {path}};
}

torch::Tensor ViTForImageClassificationImpl::head(const torch::Tensor& pixels) {
  KUAFU_CHECK(pixels.dim() == 4 && pixels.size(1) == config.num_channels && pixels.size(2) == config.image_size &&
                  pixels.size(3) == config.image_size,
              "ViT expects pixels [B, ", config.num_channels, ", ", config.image_size, ", ", config.image_size,
              "], got ", pixels.sizes());
  // The embeddings run whole on every rank of a tensor group; the blocks take the mode's cut of them.
  return parallel::enter_stream(tp, vit->embeddings(pixels));
}

torch::Tensor ViTForImageClassificationImpl::logits(const torch::Tensor& x) {
  const torch::Tensor cls = vit->layernorm.forward(x).select(1, 0);  // the class token
  return parallel::gather_classifier_logits(tp, classifier.forward(cls)).to(torch::kFloat32);
}

torch::Tensor ViTForImageClassificationImpl::tail_loss(const torch::Tensor& x, const torch::Tensor& soft_targets) {
  const torch::Tensor l = logits(x);
  return -(soft_targets.to(l.scalar_type()) * torch::log_softmax(l, -1)).sum(-1).mean();
}

torch::Tensor ViTForImageClassificationImpl::tail_sums(const torch::Tensor& x, const torch::Tensor& labels) {
  const torch::Tensor l = logits(x).to(torch::kFloat64);
  const torch::Tensor loss_sum = torch::nn::functional::cross_entropy(
      l, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  const torch::Tensor right = l.argmax(1).eq(labels).sum().to(torch::kFloat64);
  return torch::stack({loss_sum, torch::full({}, static_cast<double>(labels.size(0)), l.options()), right});
}

torch::Tensor ViTForImageClassificationImpl::forward(const torch::Tensor& pixels) {
  torch::Tensor x = head(pixels);
  for (int64_t i = 0; i < num_blocks(); ++i) x = block(i, x, {});
  return logits(x);
}

torch::Tensor ViTForImageClassificationImpl::loss(const torch::Tensor& pixels, const torch::Tensor& soft_targets) {
  torch::Tensor x = head(pixels);
  for (int64_t i = 0; i < num_blocks(); ++i) x = block(i, x, {});
  return tail_loss(x, soft_targets);
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
