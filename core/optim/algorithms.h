// The update rules: Adam/AdamW, SGD with momentum, LAMB and LARS, each with the options of its paper
// and of the reference implementations. Formulas are written out in each .cpp.
#pragma once

#include "core/optim/optimizer.h"

namespace kuafu::optim {

struct AdamOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  bool decoupled_weight_decay = true;  // AdamW (Loshchilov & Hutter); false = Adam with L2 in the gradient
  bool fused_cpu = true;               // CPU fp32 contiguous parameters take the vectorised CPU Adam kernel
  bool fused_cuda = true;              // GPU fp32 parameters take ATen's fused multi-tensor kernel, in one launch
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamOptions options);
  std::string name() const override { return options_.decoupled_weight_decay ? "adamw" : "adam"; }

 protected:
  std::vector<std::string> slot_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  void update_group(ParamGroup& group, std::vector<std::vector<torch::Tensor>>& states) override;
  bool takes_grad_factor() const override { return true; }
  bool updates_on_device() const override { return true; }
  void update_group_on_device(ParamGroup& group, std::vector<std::vector<torch::Tensor>>& states,
                              const DeviceScalars& scalars) override;

 private:
  AdamOptions options_;
};

struct SgdOptions {
  double momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
};

class Sgd : public Optimizer {
 public:
  Sgd(std::vector<ParamGroup> groups, SgdOptions options);
  std::string name() const override { return "sgd"; }

 protected:
  std::vector<std::string> slot_names() const override;
  void update_group(ParamGroup& group, std::vector<std::vector<torch::Tensor>>& states) override;

 private:
  SgdOptions options_;
};

struct LambOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-6;
  bool bias_correction = true;
  double trust_clamp = 0.0;    // > 0: the trust ratio is capped at this
  double max_grad_norm = 0.0;  // > 0: gradients are pre-scaled so their global norm is at most this
  dist::GroupPtr norm_group;   // for max_grad_norm: the ranks over which the global norm is summed
};

class Lamb : public Optimizer {
 public:
  Lamb(std::vector<ParamGroup> groups, LambOptions options);
  std::string name() const override { return "lamb"; }

 protected:
  std::vector<std::string> slot_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  void before_update() override;
  void update_group(ParamGroup& group, std::vector<std::vector<torch::Tensor>>& states) override;

 private:
  LambOptions options_;
  double grad_scale_ = 1.0;  // from the global-norm pre-clipping of this step
};

struct LarsOptions {
  double momentum = 0.9;
  double trust_coefficient = 1e-3;  // eeta
  double eps = 1e-8;
  double trust_clamp = 0.0;         // > 0: the trust ratio is capped at this
};

class Lars : public Optimizer {
 public:
  Lars(std::vector<ParamGroup> groups, LarsOptions options);
  std::string name() const override { return "lars"; }

 protected:
  std::vector<std::string> slot_names() const override;
  void update_group(ParamGroup& group, std::vector<std::vector<torch::Tensor>>& states) override;

 private:
  LarsOptions options_;
};

// The trust ratio of LAMB/LARS: numerator / denominator, or 1 where either is 0, capped at `clamp` (> 0).
torch::Tensor trust_ratio(const torch::Tensor& numerator, const torch::Tensor& denominator, double clamp);

}  // namespace kuafu::optim
