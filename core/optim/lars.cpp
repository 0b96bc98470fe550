// LARS (You et al. 2017, "Large Batch Training of Convolutional Networks"), in the form of the
// reference large-batch implementations (NVIDIA, Colossal-AI):
//   r = eeta ||p|| / (||g|| + wd ||p|| + eps)   (1 when either norm is 0 or the group has no trust
//                                                scaling; capped by trust_clamp)
//   d = lr r (g + wd p)
//   b <- mu b + d                                 (b = d without momentum)
//   p <- p - b
// ||p|| and ||g|| are summed over the parameter's shard group, so a sharded step equals the unsharded one.
#include "core/optim/algorithms.h"

namespace kuafu::optim {

Lars::Lars(std::vector<ParamGroup> groups, LarsOptions options) : Optimizer(std::move(groups)), options_(options) {}

std::vector<std::string> Lars::slot_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

void Lars::update_group(ParamGroup& group, std::vector<std::vector<torch::Tensor>>& states) {
  const double lr = this->lr() * group.options.lr_scale;
  const double wd = group.options.weight_decay;
  std::vector<size_t> index;
  std::vector<torch::Tensor> norm_inputs;
  std::vector<dist::GroupPtr> norm_groups;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Param& param = group.params[i];
    if (!param.tensor.grad().defined()) continue;
    index.push_back(i);
    norm_inputs.insert(norm_inputs.end(), {param.tensor, param.tensor.grad()});
    norm_groups.insert(norm_groups.end(), {param.shard_group, param.shard_group});
  }
  if (index.empty()) return;
  torch::Tensor ratios;
  if (group.options.trust_scaling) {
    torch::Tensor norms = squared_norms(norm_inputs, norm_groups).view({-1, 2}).sqrt();
    torch::Tensor w = norms.select(1, 0), g = norms.select(1, 1);
    // The ratio is 1 when either norm is 0; trust_ratio() tests its arguments, so pass w and g-based terms.
    torch::Tensor denominator = torch::where(g > 0, g + wd * w + options_.eps, torch::zeros_like(g));
    ratios = trust_ratio(options_.trust_coefficient * w, denominator, options_.trust_clamp);
  }
  for (size_t k = 0; k < index.size(); ++k) {
    torch::Tensor p = group.params[index[k]].tensor;
    torch::Tensor d = wd != 0 ? p.grad().add(p, wd) : p.grad().clone();
    if (ratios.defined()) {
      d.mul_((ratios[static_cast<int64_t>(k)] * lr).to(d.scalar_type()));
    } else {
      d.mul_(lr);
    }
    if (options_.momentum != 0) {
      auto& buffer = states[index[k]][0];
      buffer.mul_(options_.momentum).add_(d);
      d = buffer;
    }
    p.sub_(d);
  }
}

}  // namespace kuafu::optim
