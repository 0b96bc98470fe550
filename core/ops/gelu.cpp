#include "core/ops/gelu.h"

#include "core/ops/fused_kernels.h"
#include "core/ops/gelu_tanh_cpu.h"

namespace kuafu::ops {

namespace {

class GeluTanhFunction : public torch::autograd::Function<GeluTanhFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    torch::Tensor y = torch::empty_like(x);
    cpu::gelu_tanh(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    ctx->save_for_backward({x});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::Tensor x = ctx->get_saved_variables()[0];
    const torch::Tensor grad_y = grad_outputs[0].contiguous();
    torch::Tensor grad_x = torch::empty_like(x);
    cpu::gelu_tanh_backward(grad_y.data_ptr<float>(), x.data_ptr<float>(), grad_x.data_ptr<float>(), x.numel());
    return {grad_x};
  }
};

}  // namespace

bool gelu_tanh_kernel_takes(const torch::Tensor& x) {
  return x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.layout() == torch::kStrided && x.is_contiguous();
}

torch::Tensor gelu_tanh(const torch::Tensor& x) {
  if (fused_kernels().gelu && gelu_tanh_kernel_takes(x)) return GeluTanhFunction::apply(x);
  return torch::gelu(x, "tanh");
}

}  // namespace kuafu::ops
