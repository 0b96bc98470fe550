#include "core/parallel/tensor/vocab_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include "core/dist/autograd_collectives.h"
#include "core/dist/collectives.h"
#include "core/util/error.h"

namespace kuafu::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct OwnedTargets {
  torch::Tensor mask;   // [N] true where this rank holds the target id
  torch::Tensor local;  // [N] the target's column in this rank's block (0 where not held)
};

OwnedTargets owned(const torch::Tensor& targets, int64_t start, int64_t size) {
  torch::Tensor mask = (targets >= start).logical_and(targets < start + size);
  return {mask, torch::where(mask, targets - start, torch::zeros_like(targets))};
}

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& targets,
                               int64_t vocab_start, dist::GroupPtr group) {
    torch::NoGradGuard no_grad;
    torch::Tensor max = std::get<0>(logits.max(/*dim=*/1));
    dist::all_reduce(max, *group, dist::Reduce::kMax);
    torch::Tensor exp = (logits - max.unsqueeze(1)).exp();
    torch::Tensor sum = exp.sum(1);
    dist::all_reduce(sum, *group);
    const OwnedTargets t = owned(targets, vocab_start, logits.size(1));
    torch::Tensor picked = logits.gather(1, t.local.unsqueeze(1)).squeeze(1) * t.mask.to(logits.scalar_type());
    dist::all_reduce(picked, *group);
    // loss_i = log sum_j exp(z_ij) - z_i,target, computed around the row maximum, averaged over the
    // learned rows (weight 1/count each, 0 for an ignored row)
    const torch::Tensor weights = (targets != kIgnoredTarget).to(logits.scalar_type()) / learned_count(targets);
    torch::Tensor loss = ((sum.log() + max - picked) * weights).sum();
    ctx->save_for_backward({exp / sum.unsqueeze(1), t.local, t.mask, weights});
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    torch::Tensor d = saved[0].clone();  // softmax over this rank's columns
    const torch::Tensor& local = saved[1];
    const torch::Tensor& mask = saved[2];
    const torch::Tensor& weights = saved[3];
    d.scatter_add_(1, local.unsqueeze(1), -mask.to(d.scalar_type()).unsqueeze(1));
    d.mul_(weights.unsqueeze(1) * grad[0]);
    return {d, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, const dist::ProcessMesh& mesh,
                                                       std::string axis)
    : axis_(std::move(axis)), group_(mesh.group(axis_)) {
  const int64_t p = mesh.size(axis_);
  KUAFU_CHECK(vocab % p == 0, "tensor parallelism: vocabulary size ", vocab, " is not divisible by ", p,
              " (pad the vocabulary)");
  vocab_start_ = mesh.coordinate(axis_) * (vocab / p);
  weight = register_parameter("weight", torch::zeros({vocab / p, dim}, parameter_options(mesh)));
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& ids) {
  const OwnedTargets t = owned(ids, vocab_start_, weight.size(0));
  torch::Tensor rows = torch::embedding(weight, t.local) * t.mask.unsqueeze(-1).to(weight.scalar_type());
  return dist::autograd::reduce_from_group(rows, group_);
}

torch::Tensor VocabParallelEmbeddingImpl::logits(const torch::Tensor& hidden) {
  return torch::matmul(dist::autograd::copy_to_group(hidden, group_), weight.t());
}

torch::Tensor VocabParallelEmbeddingImpl::cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), vocab_start_,
                                      group_);
}

torch::Tensor VocabParallelEmbeddingImpl::gather_logits(const torch::Tensor& logits) {
  return dist::all_gather(logits.contiguous(), *group_, logits.dim() - 1);
}

std::map<std::string, Layout> VocabParallelEmbeddingImpl::parameter_layouts() const {
  return {{"weight", {{0, {axis_}, 1}}}};
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           int64_t vocab_start, dist::GroupPtr group) {
  KUAFU_CHECK(logits.dim() == 2 && targets.dim() == 1 && logits.size(0) == targets.size(0),
              "vocab_parallel_cross_entropy: logits [N, V/P] and targets [N], got ", logits.sizes(), " and ",
              targets.sizes());
  return VocabParallelCrossEntropy::apply(logits, targets, vocab_start, std::move(group));
}

torch::Tensor rows_block(const torch::Tensor& batch, const dist::ProcessGroup& rows) {
  const int64_t blocks = rows.size();
  KUAFU_CHECK(batch.dim() >= 1 && batch.size(0) % blocks == 0, "tensor parallelism: the batch of ",
              batch.dim() ? batch.size(0) : 0, " rows does not divide into the ", blocks, " row blocks of group '",
              rows.name(), "'; use a batch size that is a multiple of ", blocks);
  const int64_t n = batch.size(0) / blocks;
  return batch.narrow(0, rows.rank() * n, n);
}

torch::Tensor blocked_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                    const dist::GroupPtr& vocab, const dist::GroupPtr& rows) {
  KUAFU_CHECK(logits.dim() == targets.dim() + 1 && logits.sizes().slice(0, targets.dim()) == targets.sizes(),
              "cross-entropy of blocked logits: logits [B/r, ..., V/v] and this rank's targets [B/r, ...], got ",
              logits.sizes(), " and ", targets.sizes());
  const torch::Tensor block_mean = vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                                targets.reshape({-1}), vocab->rank() * logits.size(-1),
                                                                vocab);
  // Blocks hold different numbers of learned tokens, so each weighs in by its share n_b / n:
  // L = Σ_blocks (n_b / n) loss_b, all-reduced over the row blocks forward. Its backward is the
  // identity: ∂L/∂logits = (n_b / n) ∂loss_b/∂logits is what each rank computes from its own rows.
  const torch::Tensor block_learned = (targets != kIgnoredTarget).sum().to(block_mean.scalar_type());
  torch::Tensor all_learned = block_learned.clone();
  dist::all_reduce(all_learned, *rows);
  return dist::autograd::reduce_from_group(block_mean * block_learned / all_learned.clamp_min(1), rows);
}

torch::Tensor gather_blocked_logits(const torch::Tensor& logits, const dist::GroupPtr& vocab,
                                    const dist::GroupPtr& rows) {
  const torch::Tensor full_rows = dist::all_gather(logits.contiguous(), *vocab, logits.dim() - 1);
  return dist::all_gather(full_rows, *rows, /*dim=*/0);
}

}  // namespace kuafu::parallel
