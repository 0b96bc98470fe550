// Vision Transformer (ViT) for image classification with Hugging Face's parameter names and shapes
// (vit.embeddings.patch_embeddings.projection.weight is a [H, C, P, P] convolution, linear weights are
// [out, in]): class token, learned position embeddings, pre-norm blocks, a linear head on the class token.
#pragma once

#include "core/parallel/tensor/factory.h"

namespace kuafu::vit {

// Field names follow Hugging Face's ViTConfig.
struct ViTConfig {
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t num_channels = 3;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  int64_t num_labels = 1000;
  double hidden_dropout_prob = 0.0;           // embeddings and residual branches
  double attention_probs_dropout_prob = 0.0;  // attention probabilities
  double layer_norm_eps = 1e-12;

  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
  int64_t sequence_length() const { return num_patches() + 1; }  // patches and the class token
  int64_t parameter_count() const;
  // Forward + backward FLOPs per image: 6 per parameter-token product (patch projection, blocks, head)
  // plus the attention matmuls, 12·L·H·T² per image.
  double flops_per_image() const;
  // Throws (naming the field) when the shape is inconsistent, e.g. patches that do not tile the image.
  void validate() const;
};

// Patches -> hidden features: a convolution with kernel and stride P ("projection"; parameters
// weight [H, C, P, P] and bias [H], as torch.nn.Conv2d names them).
struct PatchEmbeddingsImpl : torch::nn::Module {
  PatchEmbeddingsImpl(const ViTConfig& config, const torch::Device& device);
  torch::Tensor forward(const torch::Tensor& pixels);  // [B, C, S, S] -> [B, N, H]
  std::shared_ptr<torch::nn::Module> projection;
  torch::Tensor weight, bias;  // projection's
  int64_t patch_size;
};
TORCH_MODULE(PatchEmbeddings);

// Class token + patch embeddings + position embeddings, computed whole on every rank.
struct EmbeddingsImpl : torch::nn::Module {
  EmbeddingsImpl(const ViTConfig& config, const torch::Device& device);
  torch::Tensor forward(const torch::Tensor& pixels);  // -> [B, N + 1, H]
  torch::Tensor cls_token;            // [1, 1, H]
  torch::Tensor position_embeddings;  // [1, N + 1, H]
  PatchEmbeddings patch_embeddings{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(Embeddings);

// Every linear layer and LayerNorm comes from the parallel:: factories: query, key, value and the MLP's
// first layer are column layers (each rank holds whole heads), the output projections row layers.
struct SelfAttentionImpl : torch::nn::Module {
  SelfAttentionImpl(const ViTConfig& config, const parallel::TensorParallel& tp);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::AnyModule query, key, value;
  int64_t heads;  // on this rank
  double dropout;
};
TORCH_MODULE(SelfAttention);

struct DenseImpl : torch::nn::Module {  // a module holding one linear layer named "dense"
  DenseImpl(const parallel::TensorParallel& tp, int64_t in, int64_t out, parallel::Cut cut);
  torch::Tensor forward(const torch::Tensor& x) { return dense.forward(x); }
  torch::nn::AnyModule dense;
};
TORCH_MODULE(Dense);

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(const ViTConfig& config, const parallel::TensorParallel& tp);
  torch::Tensor forward(const torch::Tensor& x) { return output->forward(attention->forward(x)); }
  SelfAttention attention{nullptr};
  Dense output{nullptr};
};
TORCH_MODULE(Attention);

struct LayerImpl : torch::nn::Module {
  LayerImpl(const ViTConfig& config, const parallel::TensorParallel& tp);
  torch::Tensor forward(const torch::Tensor& x);
  Attention attention{nullptr};
  Dense intermediate{nullptr}, output{nullptr};
  torch::nn::AnyModule layernorm_before, layernorm_after;
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(Layer);

struct ViTModelImpl : torch::nn::Module {
  ViTModelImpl(const ViTConfig& config, const parallel::TensorParallel& tp);
  Embeddings embeddings{nullptr};
  std::shared_ptr<torch::nn::Module> encoder;  // child "layer" holds "0" .. "L-1"
  std::vector<Layer> layers;
  torch::nn::AnyModule layernorm;
};
TORCH_MODULE(ViTModel);

struct ViTForImageClassificationImpl : torch::nn::Module {
  // `tp` (default: serial) cuts the blocks and the head; the model is initialised as the serial one
  // from the same seed (truncated normal, std 0.02; zero biases).
  explicit ViTForImageClassificationImpl(const ViTConfig& config, parallel::TensorParallel tp = {});

  // Logits [B, num_labels] for pixels [B, C, S, S], whole on every rank (every rank of a tensor
  // group passes the same whole batch).
  torch::Tensor forward(const torch::Tensor& pixels);
  // Mean cross-entropy against soft targets [B, num_labels] (one-hot, label-smoothed or mixed up).
  torch::Tensor loss(const torch::Tensor& pixels, const torch::Tensor& soft_targets);

  ViTConfig config;
  parallel::TensorParallel tp;
  ViTModel vit{nullptr};
  torch::nn::AnyModule classifier;
};
TORCH_MODULE(ViTForImageClassification);

// Soft targets for labels [B]: 1 − ε on the label and ε / K spread over all K classes.
torch::Tensor smoothed_targets(const torch::Tensor& labels, int64_t classes, double smoothing);

}  // namespace kuafu::vit
