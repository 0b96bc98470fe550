#include "core/hooks/grad_ready.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "core/util/error.h"

namespace kuafu::hooks {
namespace {

struct GradReadyHook : torch::autograd::FunctionPostHook {
  explicit GradReadyHook(std::function<void()> on_ready) : on_ready(std::move(on_ready)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    on_ready();
    return outputs;
  }
  std::function<void()> on_ready;
};

// The main gradient lives on the parameter's AccumulateGrad node, as Megatron keeps it on the parameter
// (param.main_grad): grad_of finds it from the parameter alone.
struct MainGradHook : torch::autograd::FunctionPostHook {
  MainGradHook(torch::Tensor param, torch::Tensor main_grad) : param(std::move(param)), main_grad(std::move(main_grad)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    torch::Tensor& grad = param.mutable_grad();
    if (grad.defined()) {
      torch::NoGradGuard no_grad;
      main_grad.add_(grad);  // widened as it is added: bf16 and fp16 values are exact in float32
      grad = torch::Tensor();
    }
    return outputs;
  }
  torch::Tensor param;  // the node holds it too
  torch::Tensor main_grad;
};

}  // namespace

std::shared_ptr<torch::autograd::Node> on_grad_accumulated(const torch::Tensor& param, std::function<void()> on_ready) {
  auto accumulator = torch::autograd::impl::grad_accumulator(param);
  accumulator->add_post_hook(std::make_unique<GradReadyHook>(std::move(on_ready)));
  return accumulator;
}

std::shared_ptr<torch::autograd::Node> accumulate_into_main_grad(const torch::Tensor& param, torch::Tensor main_grad) {
  KUAFU_CHECK(main_grad.sizes() == param.sizes() && main_grad.device() == param.device(),
              "a main gradient must have its parameter's shape ", param.sizes(), " and device ", param.device(),
              ", got ", main_grad.sizes(), " on ", main_grad.device());
  auto accumulator = torch::autograd::impl::grad_accumulator(param);
  accumulator->add_post_hook(std::make_unique<MainGradHook>(param, std::move(main_grad)));
  return accumulator;
}

torch::Tensor grad_of(const torch::Tensor& param) {
  if (const auto accumulator = torch::autograd::impl::try_get_grad_accumulator(param)) {
    for (const auto& hook : accumulator->post_hooks()) {
      if (const auto* main = dynamic_cast<const MainGradHook*>(hook.get())) return main->main_grad;
    }
  }
  return param.grad();
}

}  // namespace kuafu::hooks
