#include "core/ops/gelu.h"

#include "core/ops/fused_kernels.h"
#include "core/ops/gelu_tanh_cpu.h"

namespace kuafu::ops {

namespace {

uint16_t* bits(const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

class GeluTanhFunction : public torch::autograd::Function<GeluTanhFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    torch::Tensor y = torch::empty_like(x);
    if (x.scalar_type() == torch::kBFloat16) {
      cpu::gelu_tanh_bf16(bits(x), bits(y), x.numel());
    } else {
      cpu::gelu_tanh(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    }
    ctx->save_for_backward({x});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::Tensor x = ctx->get_saved_variables()[0];
    const torch::Tensor grad_y = grad_outputs[0].to(x.scalar_type()).contiguous();
    torch::Tensor grad_x = torch::empty_like(x);
    if (x.scalar_type() == torch::kBFloat16) {
      cpu::gelu_tanh_backward_bf16(bits(grad_y), bits(x), bits(grad_x), x.numel());
    } else {
      cpu::gelu_tanh_backward(grad_y.data_ptr<float>(), x.data_ptr<float>(), grad_x.data_ptr<float>(), x.numel());
    }
    return {grad_x};
  }
};

}  // namespace

bool gelu_tanh_kernel_takes(const torch::Tensor& x) {
  const auto type = x.scalar_type();
  return x.device().is_cpu() && (type == torch::kFloat32 || type == torch::kBFloat16) && x.layout() == torch::kStrided &&
         x.is_contiguous();
}

torch::Tensor gelu_tanh(const torch::Tensor& x) {
  if (fused_kernels().gelu && gelu_tanh_kernel_takes(x)) return GeluTanhFunction::apply(x);
  return torch::gelu(x, "tanh");
}

}  // namespace kuafu::ops
