#include "core/nn/grad_ready.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace kuafu::nn {
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

}  // namespace

std::shared_ptr<torch::autograd::Node> on_grad_accumulated(const torch::Tensor& param, std::function<void()> on_ready) {
  auto accumulator = torch::autograd::impl::grad_accumulator(param);
  accumulator->add_post_hook(std::make_unique<GradReadyHook>(std::move(on_ready)));
  return accumulator;
}

}  // namespace kuafu::nn
