// Embeddings for every tensor-parallel mode. A token embedding also serves as the model's output layer
// (tied weights), so it owns everything that depends on how the vocabulary is cut: the lookup, the
// logits, the loss and gathering the logits. A model holds one through this interface and is written
// once for all modes.
#pragma once

#include <string>
#include <vector>

#include "core/dist/process_mesh.h"
#include "core/io/targets.h"
#include "core/parallel/tensor/layout.h"

namespace kuafu::parallel {

using io::kIgnoredTarget;
// How many targets are learned (not kIgnoredTarget), at least 1 so that a batch with none divides to 0.
torch::Tensor learned_count(const torch::Tensor& targets);

class TokenEmbeddingImpl : public torch::nn::Module {
 public:
  // This rank's block of the embedded activation for token ids [B, ...], the whole batch of this data
  // rank: the batch rows and features the mode gives this rank ([B, ..., dim] when serial or 1D).
  virtual torch::Tensor forward(const torch::Tensor& ids) = 0;
  // The tied output layer, logits = hidden E^T: this rank's block of the logits from its block of the
  // final hidden states.
  virtual torch::Tensor logits(const torch::Tensor& hidden) = 0;
  // Mean cross-entropy over the learned tokens of `targets` [B, ...] (the whole batch, as given to
  // forward; kIgnoredTarget takes no part, and a batch with no learned token gives 0 and no gradient),
  // never gathering the logits. The same value on every rank of the tensor group; each rank's backward
  // yields the exact gradient of its own logits block.
  virtual torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) = 0;
  // The same loss of the tied output layer for this rank's block of the final hidden states [B, ..., dim]:
  // cross_entropy(logits(hidden) in float32, targets), which the serial embedding fuses into one pass
  // (ops::linear_cross_entropy) unless runtime.fused_loss is off.
  virtual torch::Tensor output_loss(const torch::Tensor& hidden, const torch::Tensor& targets);
  // The full logits [B, ..., V] on every rank of the tensor group (inference, tests).
  virtual torch::Tensor gather_logits(const torch::Tensor& logits) = 0;
};

// The serial token embedding E [vocab, dim]. Unlike torch::nn::Embedding it draws no random numbers
// when built (the model initialises it), so serial and parallel models consume the generator alike.
class SerialEmbeddingImpl : public TokenEmbeddingImpl {
 public:
  SerialEmbeddingImpl(int64_t vocab, int64_t dim, const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& ids) override;
  torch::Tensor logits(const torch::Tensor& hidden) override;
  torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) override;
  torch::Tensor output_loss(const torch::Tensor& hidden, const torch::Tensor& targets) override;
  torch::Tensor gather_logits(const torch::Tensor& logits) override { return logits; }
  torch::Tensor weight;  // [vocab, dim]
};
TORCH_MODULE(SerialEmbedding);

// An embedding added to every row of the batch (e.g. positions) in a mode that cuts the activation's
// features over `feature_axis` and its batch rows over `row_axes`: the table's features are cut like
// the activation's, E_f = E[:, features block f] [n, dim/q], and replicated over the row axes, whose
// ranks see other batch rows, so the gradient is summed over them. Output [..., dim/q] for ids [1, ...]
// (broadcast over the rows) or for this rank's rows of ids [B, ...] (every row's: packed rows' positions).
class FeatureSplitEmbeddingImpl : public torch::nn::Module, public ShardedModule {
 public:
  FeatureSplitEmbeddingImpl(int64_t n, int64_t dim, const dist::ProcessMesh& mesh, std::string feature_axis,
                            std::vector<std::string> row_axes);
  torch::Tensor forward(const torch::Tensor& ids);
  std::map<std::string, Layout> parameter_layouts() const override;
  torch::Tensor weight;  // [n, dim/q]

 private:
  std::string feature_axis_;
  dist::GroupPtr replicas_;  // along the row axes
};
TORCH_MODULE(FeatureSplitEmbedding);

}  // namespace kuafu::parallel
