// SGD with momentum, as torch.optim.SGD computes it:
//   g <- g + wd p
//   b <- g on the first step, else mu b + (1 - dampening) g
//   g <- g + mu b (Nesterov) or b
//   p <- p - lr g
#include "core/optim/algorithms.h"

#include "core/util/error.h"

namespace kuafu::optim {

Sgd::Sgd(std::vector<ParamGroup> groups, SgdOptions options) : Optimizer(std::move(groups)), options_(options) {
  KUAFU_CHECK(!options_.nesterov || (options_.momentum > 0 && options_.dampening == 0),
              "Nesterov momentum needs momentum > 0 and dampening 0");
}

std::vector<std::string> Sgd::slot_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

void Sgd::update_group(ParamGroup& group, std::vector<std::vector<torch::Tensor>>& states) {
  const double lr = this->lr() * group.options.lr_scale;
  const double wd = group.options.weight_decay;
  const double mu = options_.momentum;
  for (size_t i = 0; i < group.params.size(); ++i) {
    torch::Tensor p = group.params[i].tensor;
    torch::Tensor g = p.grad();
    if (!g.defined()) continue;
    if (wd != 0) g = g.add(p, wd);
    if (mu != 0) {
      auto& buffer = states[i][0];
      if (steps_taken() == 1) {
        buffer.copy_(g);
      } else {
        buffer.mul_(mu).add_(g, 1.0 - options_.dampening);
      }
      g = options_.nesterov ? g.add(buffer, mu) : buffer;
    }
    p.add_(g, -lr);
  }
}

}  // namespace kuafu::optim
