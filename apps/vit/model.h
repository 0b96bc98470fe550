// Vision Transformer (ViT) for image classification with Hugging Face's parameter names and shapes
// (vit.embeddings.patch_embeddings.projection.weight is a [H, C, P, P] convolution, linear weights are
// [out, in]): class token, learned position embeddings, pre-norm blocks, a linear head on the class token.
#pragma once

#include "core/hooks/block_model.h"
#include "core/nn/transformer_block.h"
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

// ViT's encoder layer: pre-norm, not causal, exact GELU, separate query/key/value, under Hugging Face's
// names (attention.attention.query, ..., intermediate.dense, output.dense).
nn::TransformerBlockSpec block_spec(const ViTConfig& config);

struct ViTModelImpl : torch::nn::Module {
  ViTModelImpl(const ViTConfig& config, const parallel::ModelOptions& options);
  Embeddings embeddings{nullptr};
  std::shared_ptr<torch::nn::Module> encoder;  // child "layer" holds "0" .. "L-1"
  std::vector<nn::TransformerBlock> layers;
  torch::nn::AnyModule layernorm;
};
TORCH_MODULE(ViTModel);

// The model as maths: embeddings (the head), the encoder layers, the final norm and the classifier on
// the class token (the tail). Strategies other than tensor parallelism apply from outside.
struct ViTForImageClassificationImpl : torch::nn::Module, hooks::OneStreamModel {
  // `tp` (default: serial) cuts the blocks and the head; the model is initialised as the serial one
  // from the same seed (truncated normal, std 0.02; zero biases). On the meta device it is only
  // described (lazy construction): initialize() once it has storage.
  explicit ViTForImageClassificationImpl(const ViTConfig& config, parallel::ModelOptions options = {});
  // Hugging Face's initialisation, drawn as the serial model's.
  void initialize();

  // Logits [B, num_labels] for pixels [B, C, S, S], whole on every rank (every rank of a tensor
  // group passes the same whole batch).
  torch::Tensor forward(const torch::Tensor& pixels);
  // Mean cross-entropy against soft targets [B, num_labels] (one-hot, label-smoothed or mixed up).
  torch::Tensor loss(const torch::Tensor& pixels, const torch::Tensor& soft_targets);

  // hooks::BlockModel: head = embeddings, block i = encoder layer i, tail = final norm and classifier.
  // Training targets are soft [B, num_labels]; evaluation targets are labels [B].
  torch::nn::Module& module() override { return *this; }
  int64_t num_blocks() const override { return config.num_hidden_layers; }
  hooks::ModelPart head_part() const override { return {"vit.embeddings", {"vit.embeddings"}}; }
  hooks::ModelPart block_part(int64_t i) const override;
  hooks::ModelPart tail_part() const override { return {"vit.head", {"vit.layernorm", "classifier"}}; }
  torch::Tensor head(const torch::Tensor& pixels) override;
  torch::Tensor block(int64_t i, const torch::Tensor& x, const torch::Tensor& /*context*/) override {
    return vit->layers[static_cast<size_t>(i)]->forward(x);
  }
  torch::Tensor tail_loss(const torch::Tensor& x, const torch::Tensor& soft_targets) override;
  torch::Tensor tail_sums(const torch::Tensor& x, const torch::Tensor& labels) override;

  ViTConfig config;
  parallel::TensorParallel tp;
  ViTModel vit{nullptr};
  torch::nn::AnyModule classifier;

 private:
  torch::Tensor logits(const torch::Tensor& x);  // the final stream -> [B, num_labels], whole
};
TORCH_MODULE(ViTForImageClassification);

// Soft targets for labels [B]: 1 − ε on the label and ε / K spread over all K classes.
torch::Tensor smoothed_targets(const torch::Tensor& labels, int64_t classes, double smoothing);

}  // namespace kuafu::vit
