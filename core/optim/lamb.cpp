// LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning", Algorithm 2), step t:
//   g <- g * min(1, max_grad_norm / ||G||)      optional pre-clipping by the global norm ||G||
//   m <- b1 m + (1 - b1) g                      v <- b2 v + (1 - b2) g^2
//   m^ = m / (1 - b1^t), v^ = v / (1 - b2^t)    (without bias correction: m^ = m, v^ = v)
//   u = m^ / (sqrt(v^) + eps) + wd p
//   r = ||p|| / ||u||  (1 when either norm is 0, or for groups without trust scaling; capped by trust_clamp)
//   p <- p - lr r u
// ||p|| and ||u|| are summed over the parameter's shard group, so a sharded step equals the unsharded one.
#include "core/optim/algorithms.h"

#include <cmath>

#include "core/optim/grad_norm.h"

namespace kuafu::optim {

torch::Tensor trust_ratio(const torch::Tensor& numerator, const torch::Tensor& denominator, double clamp) {
  torch::Tensor ratio =
      torch::where((numerator > 0).logical_and(denominator > 0), numerator / denominator, torch::ones_like(numerator));
  return clamp > 0 ? ratio.clamp_max(clamp) : ratio;
}

Lamb::Lamb(std::vector<ParamGroup> groups, LambOptions options) : Optimizer(std::move(groups)), options_(options) {}

void Lamb::before_update() {
  grad_scale_ = 1.0;
  if (options_.max_grad_norm <= 0) return;
  std::vector<Param> all;
  for (const auto& group : groups()) all.insert(all.end(), group.params.begin(), group.params.end());
  const double norm = global_grad_norm(all, options_.norm_group);
  if (norm > options_.max_grad_norm) grad_scale_ = options_.max_grad_norm / norm;
}

void Lamb::update_group(ParamGroup& group, std::vector<std::vector<torch::Tensor>>& states) {
  const double lr = this->lr() * group.options.lr_scale;
  const double wd = group.options.weight_decay;
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double t = static_cast<double>(steps_taken());
  const double bias1 = options_.bias_correction ? 1.0 - std::pow(b1, t) : 1.0;
  const double bias2 = options_.bias_correction ? 1.0 - std::pow(b2, t) : 1.0;

  // First the Adam-style direction u of every parameter, then all norms in one reduction per group.
  std::vector<size_t> index;
  std::vector<torch::Tensor> updates, norm_inputs;
  std::vector<dist::GroupPtr> norm_groups;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Param& param = group.params[i];
    torch::Tensor g = param.tensor.grad();
    if (!g.defined()) continue;
    if (grad_scale_ != 1.0) g = g * grad_scale_;
    auto& m = states[i][0];
    auto& v = states[i][1];
    m.mul_(b1).add_(g, 1.0 - b1);
    v.mul_(b2).addcmul_(g, g, 1.0 - b2);
    torch::Tensor u = (m / bias1).div_((v / bias2).sqrt_().add_(options_.eps));
    if (wd != 0) u.add_(param.tensor, wd);
    index.push_back(i);
    updates.push_back(u);
    if (group.options.trust_scaling) {
      norm_inputs.insert(norm_inputs.end(), {param.tensor, u});
      norm_groups.insert(norm_groups.end(), {param.shard_group, param.shard_group});
    }
  }
  torch::Tensor ratios;
  if (group.options.trust_scaling && !updates.empty()) {
    torch::Tensor squares = squared_norms(norm_inputs, norm_groups).view({-1, 2});
    torch::Tensor norms = squares.sqrt();
    ratios = trust_ratio(norms.select(1, 0), norms.select(1, 1), options_.trust_clamp);
  }
  for (size_t k = 0; k < updates.size(); ++k) {
    torch::Tensor p = group.params[index[k]].tensor;
    if (ratios.defined()) {
      // -lr * r as a tensor keeps the ratio on the device (no host synchronisation per parameter).
      p.sub_(updates[k] * (ratios[static_cast<int64_t>(k)] * lr).to(updates[k].scalar_type()));
    } else {
      p.sub_(updates[k], lr);
    }
  }
}

}  // namespace kuafu::optim
