// Vocabulary-parallel embedding and cross-entropy (1D): the vocabulary's rows are cut into P equal
// ranges, one per rank, and neither the embedding table nor the logits are ever gathered.
#pragma once

#include "core/parallel/tensor/layout.h"

namespace kuafu::parallel {

// E = [E_1; ...; E_P] split by vocabulary rows: rank r looks up the ids in its range [r V/P, (r+1) V/P)
// (zero rows for the others) and the partial lookups are summed over the ranks (all-reduce forward,
// identity backward). Output [..., dim], replicated.
class VocabParallelEmbeddingImpl : public torch::nn::Module, public ShardedModule {
 public:
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, const dist::ProcessMesh& mesh, std::string axis = "tensor");
  torch::Tensor forward(const torch::Tensor& ids);
  std::map<std::string, Layout> parameter_layouts() const override;

  int64_t vocab_start() const { return vocab_start_; }  // first id this rank holds

  torch::Tensor weight;  // [V/P, dim]

 private:
  std::string axis_;
  dist::GroupPtr group_;
  int64_t vocab_start_ = 0;
};
TORCH_MODULE(VocabParallelEmbedding);

// Mean cross-entropy of logits cut by vocabulary along the last dimension ([N, V/P] on each rank, this
// rank's ids starting at `vocab_start`) against global target ids [N]. The row maximum and the sum of
// exponentials are all-reduced, the target's logit comes from the rank that holds it; the backward
// is softmax - one-hot on each rank's own columns. Equals the serial cross-entropy of the full logits.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           int64_t vocab_start, dist::GroupPtr group);

}  // namespace kuafu::parallel
