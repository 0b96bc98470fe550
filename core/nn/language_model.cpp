#include "core/nn/language_model.h"

namespace kuafu::nn {

torch::Tensor run_blocks(std::vector<TransformerBlock>& blocks, torch::Tensor x, std::vector<ops::KVCache>* caches,
                         const torch::Tensor& key_padding) {
  if (caches && caches->empty()) caches->resize(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) x = blocks[i]->forward(x, caches ? &(*caches)[i] : nullptr, key_padding);
  return x;
}

torch::Tensor tied_output_loss(parallel::TokenEmbeddingImpl& embedding, const torch::Tensor& logits,
                               const torch::Tensor& targets) {
  return embedding.cross_entropy(logits.to(at::promote_types(logits.scalar_type(), torch::kFloat32)), targets);
}

torch::Tensor token_loss_sums(const torch::Tensor& mean_loss, const torch::Tensor& targets) {
  const double tokens = static_cast<double>((targets != parallel::kIgnoredTarget).sum().item<int64_t>());
  const torch::Tensor mean = mean_loss.detach().to(torch::kFloat64).reshape({1});
  return torch::cat({mean * tokens, torch::tensor({tokens, 0.0}, mean.options())});
}

}  // namespace kuafu::nn
