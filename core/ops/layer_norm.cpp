#include "core/ops/layer_norm.h"

#include "core/ops/fused_kernels.h"
#include "core/util/error.h"

#ifdef KUAFU_WITH_CUDA
#include "core/ops/cuda_tensors.h"
#include "core/ops/layer_norm_cuda.h"
#endif

namespace kuafu::ops {

#ifdef KUAFU_WITH_CUDA
namespace {

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, double eps) {
    const int64_t c = x.size(-1);
    const torch::Tensor rows = x.contiguous().view({-1, c});  // [N, C]
    torch::Tensor y = torch::empty_like(rows);
    const auto stats = rows.options().dtype(torch::kFloat32);
    torch::Tensor mean = torch::empty({rows.size(0)}, stats), rstd = torch::empty({rows.size(0)}, stats);
    KUAFU_CHECK(cuda::layer_norm_forward(cuda::row_type(rows), rows.data_ptr(), weight.data_ptr(), bias.data_ptr(), y.data_ptr(),
                                         mean.data_ptr<float>(), rstd.data_ptr<float>(), rows.size(0), c,
                                         static_cast<float>(eps), cuda::stream_of(rows)),
                "the LayerNorm kernel failed to launch on ", x.device());
    ctx->save_for_backward({rows, weight, mean, rstd});
    return y.view(x.sizes());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &rows = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    const int64_t n = rows.size(0), c = rows.size(1);
    const torch::Tensor dy = grad_outputs[0].contiguous().view({n, c});
    torch::Tensor dx = torch::empty_like(rows);
    const int64_t warps = cuda::layer_norm_backward_warps(n);
    torch::Tensor partials = torch::empty({2, warps, c}, rows.options().dtype(torch::kFloat32));  // per warp: dγ, dβ
    KUAFU_CHECK(cuda::layer_norm_backward(cuda::row_type(rows), dy.data_ptr(), rows.data_ptr(), mean.data_ptr<float>(),
                                          rstd.data_ptr<float>(), weight.data_ptr(), dx.data_ptr(),
                                          partials.data_ptr<float>(), warps, n, c, cuda::stream_of(rows)),
                "the LayerNorm backward kernel failed to launch on ", rows.device());
    const torch::Tensor sums = partials.sum(1);  // [2, C] float32
    return {dx.view(grad_outputs[0].sizes()), sums[0].to(weight.scalar_type()), sums[1].to(weight.scalar_type()), {}};
  }
};

}  // namespace
#endif

bool layer_norm_kernel_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
#ifdef KUAFU_WITH_CUDA
  const auto type = x.scalar_type();
  if (!x.is_cuda() || !weight.defined() || !bias.defined() || !cuda::has_row_type(type)) return false;
  if (weight.scalar_type() != type || bias.scalar_type() != type || !weight.is_contiguous() || !bias.is_contiguous()) return false;
  if (weight.dim() != 1 || weight.size(0) != x.size(-1) || bias.sizes() != weight.sizes()) return false;
  return x.numel() > 0 && cuda::layer_norm_takes(cuda::row_type(x), x.size(-1));
#else
  (void)x;
  (void)weight;
  (void)bias;
  return false;
#endif
}

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, double eps) {
#ifdef KUAFU_WITH_CUDA
  if (fused_kernels().layer_norm && layer_norm_kernel_takes(x, weight, bias)) {
    return LayerNormFunction::apply(x, weight, bias, eps);
  }
#endif
  return torch::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

}  // namespace kuafu::ops
