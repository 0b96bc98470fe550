#include "core/parallel/tensor/factory.h"

#include "core/parallel/tensor/vocab_parallel.h"
#include "core/util/error.h"

namespace kuafu::parallel {

dist::GroupPtr TensorParallel::group() const {
  if (!enabled()) return nullptr;
  return mesh->group(axes());
}

SerialLinearImpl::SerialLinearImpl(const LinearSpec& spec) : order_(spec.order) {
  const std::vector<int64_t> shape =
      spec.order == WeightOrder::kInOut ? std::vector<int64_t>{spec.in, spec.out} : std::vector<int64_t>{spec.out, spec.in};
  weight = register_parameter("weight", torch::zeros(shape));
  if (spec.bias) bias = register_parameter("bias", torch::zeros({spec.out}));
}

torch::Tensor SerialLinearImpl::forward(const torch::Tensor& x) {
  if (order_ == WeightOrder::kOutIn) return torch::nn::functional::linear(x, weight, bias);
  // addmm over the flattened rows: one BLAS call with the bias fused in.
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(1);
  torch::Tensor rows = x.reshape({-1, weight.size(0)});
  return (bias.defined() ? torch::addmm(bias, rows, weight) : torch::mm(rows, weight)).view(sizes);
}

SerialEmbeddingImpl::SerialEmbeddingImpl(int64_t vocab, int64_t dim) {
  weight = register_parameter("weight", torch::zeros({vocab, dim}));
}

torch::Tensor SerialEmbeddingImpl::forward(const torch::Tensor& ids) { return torch::embedding(weight, ids); }

torch::nn::AnyModule make_linear(const TensorParallel& tp, const LinearSpec& spec, Cut cut) {
  if (!tp.enabled()) return torch::nn::AnyModule(SerialLinear(spec));
  switch (tp.spec.mode) {
    case TensorMode::k1D:
      if (cut == Cut::kColumn) return torch::nn::AnyModule(ColumnParallelLinear(spec, *tp.mesh));
      return torch::nn::AnyModule(RowParallelLinear(spec, *tp.mesh));
    default:
      // The 2D, 2.5D and 3D layers exist (layers_2d.h, ...) but models do not take them from here yet.
      fail("parallel.tensor.mode = \"" + mode_name(tp.spec.mode) +
           "\" cannot build this model's layers yet; use \"1d\" (or \"none\")");
  }
}

torch::nn::AnyModule make_embedding(const TensorParallel& tp, int64_t vocab, int64_t dim) {
  if (!tp.enabled()) return torch::nn::AnyModule(SerialEmbedding(vocab, dim));
  KUAFU_CHECK(tp.spec.mode == TensorMode::k1D, "parallel.tensor.mode = \"", mode_name(tp.spec.mode),
              "\" cannot build this model's embedding yet; use \"1d\" (or \"none\")");
  return torch::nn::AnyModule(VocabParallelEmbedding(vocab, dim, *tp.mesh));
}

std::vector<int64_t> full_shape(at::IntArrayRef local, const Layout& layout, const dist::ProcessMesh& mesh) {
  std::vector<int64_t> shape = local.vec();
  for (const auto& split : layout) {
    int64_t blocks = 1;
    for (const auto& axis : split.axes) blocks *= mesh.size(axis);
    shape[static_cast<size_t>(split.dim)] *= blocks;
  }
  return shape;
}

}  // namespace kuafu::parallel
