// Adam / AdamW, step t (1-based), as torch.optim.AdamW / Adam compute it:
//   AdamW: p <- p (1 - lr wd)          Adam: g <- g + wd p
//   m <- b1 m + (1 - b1) g             v <- b2 v + (1 - b2) g^2
//   p <- p - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
#include "core/optim/algorithms.h"

#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>

#include <cmath>

#include "core/optim/cpu_adam.h"
#include "core/util/error.h"

namespace kuafu::optim {
namespace {

bool fits_cpu_kernel(const torch::Tensor& p, const torch::Tensor& g, const std::vector<torch::Tensor>& state) {
  auto ok = [](const torch::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous();
  };
  return ok(p) && ok(g) && ok(state[0]) && ok(state[1]);
}

bool fits_cuda_kernel(const torch::Tensor& p, const torch::Tensor& g) {
  return p.is_cuda() && p.scalar_type() == torch::kFloat32 && g.scalar_type() == torch::kFloat32 && g.device() == p.device();
}

}  // namespace

AdamW::AdamW(std::vector<ParamGroup> groups, AdamOptions options)
    : Optimizer(std::move(groups)), options_(options) {}

void AdamW::update_group(ParamGroup& group, std::vector<std::vector<torch::Tensor>>& states) {
  const double lr = this->lr() * group.options.lr_scale;
  const double wd = group.options.weight_decay;
  const int64_t t = steps_taken();
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double bias1 = 1.0 - std::pow(b1, static_cast<double>(t));
  const double bias2 = 1.0 - std::pow(b2, static_cast<double>(t));
  const double factor = grad_factor();  // g * factor as a float32 multiply, as Tensor::mul_ would give
  // GPU parameters go to one fused launch after the loop: one kernel per tensor would leave the GPU
  // waiting on launches (a 125M-parameter OPT has ~200 tensors).
  std::vector<torch::Tensor> fused_params, fused_grads, fused_m, fused_v;
  for (size_t i = 0; i < group.params.size(); ++i) {
    torch::Tensor p = group.params[i].tensor;
    torch::Tensor g = p.grad();
    if (!g.defined()) continue;
    auto& m = states[i][0];
    auto& v = states[i][1];
    if (options_.fused_cuda && fits_cuda_kernel(p, g)) {
      if (factor != 1.0) g.mul_(factor);
      fused_params.push_back(p), fused_grads.push_back(g), fused_m.push_back(m), fused_v.push_back(v);
      continue;
    }
    if (options_.fused_cpu && fits_cpu_kernel(p, g, states[i])) {
      CpuAdamHyper hyper;
      hyper.lr = lr;
      hyper.beta1 = b1;
      hyper.beta2 = b2;
      hyper.eps = options_.eps;
      hyper.weight_decay = wd;
      hyper.decoupled_weight_decay = options_.decoupled_weight_decay;
      hyper.step = t;
      CpuAdamBuffers buffers{p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), p.numel()};
      buffers.grad_scale = static_cast<float>(factor);  // one pass: the gradient is read once, scaled in registers
      cpu_adam_step(hyper, buffers);
      continue;
    }
    if (factor != 1.0) g = g * factor;
    if (wd != 0) {
      if (options_.decoupled_weight_decay) {
        p.mul_(1.0 - lr * wd);
      } else {
        g = g.add(p, wd);
      }
    }
    m.mul_(b1).add_(g, 1.0 - b1);
    v.mul_(b2).addcmul_(g, g, 1.0 - b2);
    torch::Tensor denom = (v.sqrt() / std::sqrt(bias2)).add_(options_.eps);
    p.addcdiv_(m, denom, -lr / bias1);
  }
  if (fused_params.empty()) return;
  // The kernel reads each parameter's step count from a tensor on its device; one serves them all.
  const std::vector<torch::Tensor> steps(fused_params.size(),
                                         torch::full({}, static_cast<double>(t), fused_params.front().options()));
  const std::vector<torch::Tensor> no_max;  // no AMSGrad
  torch::NoGradGuard no_grad;
  if (options_.decoupled_weight_decay) {
    at::_fused_adamw_(fused_params, fused_grads, fused_m, fused_v, no_max, steps, lr, b1, b2, wd, options_.eps,
                      /*amsgrad=*/false, /*maximize=*/false);
  } else {
    at::_fused_adam_(fused_params, fused_grads, fused_m, fused_v, no_max, steps, lr, b1, b2, wd, options_.eps,
                     /*amsgrad=*/false, /*maximize=*/false);
  }
}

void AdamW::update_group_on_device(ParamGroup& group, std::vector<std::vector<torch::Tensor>>& states,
                                   const DeviceScalars& scalars) {
  std::vector<torch::Tensor> params, grads, m, v;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const torch::Tensor& p = group.params[i].tensor;
    if (!p.grad().defined()) continue;
    KUAFU_CHECK(p.scalar_type() == torch::kFloat32 && p.grad().scalar_type() == torch::kFloat32 &&
                    p.device() == scalars.step.device(),
                "AdamW's step on the device takes float32 parameters and gradients on ", scalars.step.device(),
                "; '", group.params[i].name, "' is ", p.scalar_type(), " on ", p.device());
    params.push_back(p), grads.push_back(p.grad()), m.push_back(states[i][0]), v.push_back(states[i][1]);
  }
  if (params.empty()) return;
  // g * factor in float32 first, as step() multiplies on a GPU (the kernel's grad_scale would divide).
  at::_foreach_mul_(grads, scalars.grad_factor);
  const std::vector<torch::Tensor> steps(params.size(), scalars.step);  // the kernel reads each one's count
  const std::vector<torch::Tensor> no_max;                             // no AMSGrad
  const double wd = group.options.weight_decay;
  if (options_.decoupled_weight_decay) {
    at::_fused_adamw_(params, grads, m, v, no_max, steps, scalars.lr, options_.beta1, options_.beta2, wd, options_.eps,
                      /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, /*found_inf=*/scalars.skip);
  } else {
    at::_fused_adam_(params, grads, m, v, no_max, steps, scalars.lr, options_.beta1, options_.beta2, wd, options_.eps,
                     /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, /*found_inf=*/scalars.skip);
  }
}

}  // namespace kuafu::optim
