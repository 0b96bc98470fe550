// Vocabulary-parallel embedding and cross-entropy (1D): the vocabulary's rows are cut into P equal
// ranges, one per rank, and neither the embedding table nor the logits are ever gathered.
#pragma once

#include "core/parallel/tensor/embedding.h"

namespace kuafu::parallel {

// E = [E_1; ...; E_P] split by vocabulary rows: rank r looks up the ids in its range [r V/P, (r+1) V/P)
// (zero rows for the others) and the partial lookups are summed over the ranks (all-reduce forward,
// identity backward). Output [..., dim], replicated.
// Tied output layer: rank r scores its vocabulary rows, logits_r = X E_r^T [..., V/P]; X is replicated,
// so its gradient is summed over the ranks. The loss is vocab_parallel_cross_entropy below.
class VocabParallelEmbeddingImpl : public TokenEmbeddingImpl, public ShardedModule {
 public:
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, const dist::ProcessMesh& mesh, std::string axis = "tensor");
  torch::Tensor forward(const torch::Tensor& ids) override;
  torch::Tensor logits(const torch::Tensor& hidden) override;
  torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) override;
  torch::Tensor gather_logits(const torch::Tensor& logits) override;
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
// rank's ids starting at `vocab_start`) against global target ids [N], over the learned targets (not
// kIgnoredTarget; 0 when there are none). The row maximum and the sum of
// exponentials are all-reduced, the target's logit comes from the rank that holds it; the backward
// is softmax - one-hot on each rank's own columns. Equals the serial cross-entropy of the full logits.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           int64_t vocab_start, dist::GroupPtr group);

// Logits cut both by vocabulary and by batch rows (2D, 2.5D, 3D): `vocab` holds the ranks with the
// other vocabulary blocks of this rank's rows (group rank = vocabulary block), `rows` the ranks with the
// other row blocks of this vocabulary block (group rank = row block, in order).
//
// This rank's row block of a whole batch [B, ...] (ids, targets); kuafu::Error naming the sizes when B
// does not divide into `rows`' size.
torch::Tensor rows_block(const torch::Tensor& batch, const dist::ProcessGroup& rows);
// Mean cross-entropy over the learned targets of every row block: the vocabulary-parallel cross-entropy
// of this rank's rows (targets [rows, ...] = rows_block of the batch), each block weighted by its
// share of the learned targets.
torch::Tensor blocked_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                    const dist::GroupPtr& vocab, const dist::GroupPtr& rows);
// The full logits [B, ..., V] from every rank's block.
torch::Tensor gather_blocked_logits(const torch::Tensor& logits, const dist::GroupPtr& vocab,
                                    const dist::GroupPtr& rows);

}  // namespace kuafu::parallel
