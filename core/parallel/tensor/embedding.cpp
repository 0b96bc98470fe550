#include "core/parallel/tensor/embedding.h"

#include "core/dist/autograd_collectives.h"
#include "core/ops/fused_kernels.h"
#include "core/ops/linear_cross_entropy.h"
#include "core/ops/skinny_linear.h"
#include "core/parallel/tensor/vocab_parallel.h"
#include "core/util/error.h"

namespace kuafu::parallel {

SerialEmbeddingImpl::SerialEmbeddingImpl(int64_t vocab, int64_t dim, const torch::Device& device) {
  weight = register_parameter("weight", torch::zeros({vocab, dim}, torch::TensorOptions().device(device)));
}

torch::Tensor SerialEmbeddingImpl::forward(const torch::Tensor& ids) { return torch::embedding(weight, ids); }

torch::Tensor SerialEmbeddingImpl::logits(const torch::Tensor& hidden) {
  // A decoding step's few rows against the whole vocabulary: the streaming product (ops/skinny_linear.h).
  if (ops::skinny_linear_applies(hidden, weight, {})) return ops::skinny_linear(hidden, weight, {});
  return torch::matmul(hidden, weight.t());
}

torch::Tensor learned_count(const torch::Tensor& targets) { return (targets != kIgnoredTarget).sum().clamp_min(1); }

torch::Tensor SerialEmbeddingImpl::cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return ops::mean_cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), kIgnoredTarget);
}

torch::Tensor TokenEmbeddingImpl::output_loss(const torch::Tensor& hidden, const torch::Tensor& targets) {
  const torch::Tensor z = logits(hidden);
  return cross_entropy(z.to(at::promote_types(z.scalar_type(), torch::kFloat32)), targets);
}

torch::Tensor SerialEmbeddingImpl::output_loss(const torch::Tensor& hidden, const torch::Tensor& targets) {
  if (!ops::fused_kernels().loss) return TokenEmbeddingImpl::output_loss(hidden, targets);
  return ops::linear_cross_entropy(hidden.reshape({-1, hidden.size(-1)}), weight, targets.reshape({-1}), kIgnoredTarget);
}

FeatureSplitEmbeddingImpl::FeatureSplitEmbeddingImpl(int64_t n, int64_t dim, const dist::ProcessMesh& mesh,
                                                     std::string feature_axis, std::vector<std::string> row_axes)
    : feature_axis_(std::move(feature_axis)), replicas_(mesh.group(row_axes)) {
  const int64_t q = mesh.size(feature_axis_);
  KUAFU_CHECK(dim % q == 0, "tensor parallelism: embedding size ", dim, " is not divisible by the ", q, " blocks of ",
              feature_axis_);
  weight = register_parameter("weight", torch::zeros({n, dim / q}, parameter_options(mesh)));
}

torch::Tensor FeatureSplitEmbeddingImpl::forward(const torch::Tensor& ids) {
  // Ids of every batch row (packed rows' positions [B, T]) give this rank's rows; one row [1, T] broadcasts.
  const torch::Tensor mine = ids.dim() >= 2 && ids.size(0) > 1 ? rows_block(ids, *replicas_) : ids;
  return torch::embedding(dist::autograd::copy_to_group(weight, replicas_), mine);
}

std::map<std::string, Layout> FeatureSplitEmbeddingImpl::parameter_layouts() const {
  return {{"weight", {{1, {feature_axis_}, 1}}}};
}

}  // namespace kuafu::parallel
