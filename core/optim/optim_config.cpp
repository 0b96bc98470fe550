#include "core/optim/optim_config.h"

#include <fnmatch.h>

#include <algorithm>

#include "core/util/logging.h"

namespace kuafu::optim {

void add_optimizer_schema(config::Schema& s) {
  s.add_string("optim.name", "adamw", "optimizer: adamw, adam (L2 weight decay), sgd, lamb, lars")
      .choices({"adamw", "adam", "sgd", "lamb", "lars"});
  s.add_float("optim.lr", 6e-4, "peak learning rate").min(0).max(10);
  s.add_float("optim.min_lr", 6e-5, "learning rate where the decay ends (cosine, linear, polynomial)").min(0).max(10);
  s.add_int("optim.warmup_steps", 100, "steps of linear warm-up from 0 to optim.lr").min(0);
  s.add_string("optim.schedule", "cosine", "learning-rate schedule after warm-up")
      .choices(LrSchedule::kind_names());
  s.add_float("optim.power", 1.0, "polynomial schedule: decay follows (1 - progress)^power").min(1e-6);
  s.add_int_list("optim.milestones", {}, "multistep schedule: steps at which the rate is multiplied by optim.gamma");
  s.add_float("optim.gamma", 0.1, "multistep schedule: factor applied at each milestone").min(0).max(1);
  s.add_float("optim.weight_decay", 0.1, "weight decay (not for parameters matching optim.no_decay)").min(0);
  s.add_string_list("optim.no_decay", {"*.bias", "*ln_*", "*norm*"},
                    "name patterns (shell globs) of parameters without weight decay and LAMB/LARS trust scaling");
  s.add_float("optim.beta1", 0.9, "Adam/LAMB beta1").min(0).max(0.999999);
  s.add_float("optim.beta2", 0.95, "Adam/LAMB beta2").min(0).max(0.999999);
  s.add_float("optim.eps", 1e-8, "Adam/LAMB/LARS epsilon").min(0);
  s.add_bool("optim.bias_correction", true, "LAMB: Adam bias correction of the moments");
  s.add_float("optim.momentum", 0.9, "SGD/LARS momentum").min(0).max(0.999999);
  s.add_bool("optim.nesterov", false, "SGD: Nesterov momentum");
  s.add_float("optim.trust_coefficient", 1e-3, "LARS: trust coefficient eeta").min(0);
  s.add_float("optim.trust_clamp", 0.0, "LAMB/LARS: cap on the trust ratio; 0 = none").min(0);
  s.add_bool("optim.fused_cpu", true, "Adam/AdamW: vectorised CPU kernel for float32 parameters in host memory");
  s.add_bool("optim.fused_cuda", true, "Adam/AdamW: ATen's fused multi-tensor kernel for float32 parameters on a GPU");
  s.add_float("optim.grad_clip", 1.0,
              "clip the global gradient norm to this before the step (LAMB's pre-clipping); 0 = no clipping")
      .min(0);
  s.add_float("optim.ema_decay", 0.0,
              "keep an exponential moving average of the float32 weights, ema = d ema + (1 - d) w after each step "
              "(diffusion models sample with it); evaluation runs on it, and it is saved beside the model as the ema part; 0 = none")
      .min(0)
      .max(0.999999);
  s.add_string("optim.ema_warmup", "none",
               "\"diffusers\": the average's decay rises as diffusers' EMAModel's does, min(ema_decay, (1 + s) / (10 + s)) at its "
               "s-th update after the first (which copies the weights); \"power\": as EMAModel's use_ema_warmup, "
               "min(ema_decay, 1 - (1 + s / ema_inv_gamma)^-ema_power); \"none\": ema_decay from the start")
      .choices({"none", "diffusers", "power"});
  s.add_float("optim.ema_inv_gamma", 1.0, "ema_warmup = \"power\": EMAModel's inv_gamma (the updates over which the decay rises)")
      .min(1e-6);
  s.add_float("optim.ema_power", 2.0 / 3.0,
              "ema_warmup = \"power\": EMAModel's power (2/3 for models trained a million steps or more, 3/4 for shorter runs)")
      .min(1e-6)
      .max(10);
}

std::vector<ParamGroup> make_param_groups(const std::vector<Param>& params,
                                          const std::vector<std::string>& no_decay_patterns, double weight_decay) {
  ParamGroup decay{"decay", {}, {}};
  decay.options.weight_decay = weight_decay;
  ParamGroup no_decay{"no_decay", {}, {}};
  no_decay.options.trust_scaling = false;
  for (const auto& p : params) {
    const bool matched = std::any_of(no_decay_patterns.begin(), no_decay_patterns.end(), [&](const std::string& glob) {
      return fnmatch(glob.c_str(), p.name.c_str(), 0) == 0;
    });
    (matched ? no_decay : decay).params.push_back(p);
  }
  return {decay, no_decay};
}

namespace {

// The algorithm optim.name names, over `groups`.
std::unique_ptr<Optimizer> make_algorithm(const config::Config& config, std::vector<ParamGroup> groups,
                                          dist::GroupPtr norm_group) {
  const std::string name = config.get_string("optim.name");
  std::unique_ptr<Optimizer> optimizer;
  if (name == "adamw" || name == "adam") {
    AdamOptions o;
    o.beta1 = config.get_float("optim.beta1");
    o.beta2 = config.get_float("optim.beta2");
    o.eps = config.get_float("optim.eps");
    o.decoupled_weight_decay = name == "adamw";
    o.fused_cpu = config.get_bool("optim.fused_cpu");
    o.fused_cuda = config.get_bool("optim.fused_cuda");
    optimizer = std::make_unique<AdamW>(std::move(groups), o);
  } else if (name == "sgd") {
    SgdOptions o;
    o.momentum = config.get_float("optim.momentum");
    o.nesterov = config.get_bool("optim.nesterov");
    if (o.nesterov && o.momentum == 0) config.fail_at("optim.nesterov", "needs optim.momentum > 0");
    optimizer = std::make_unique<Sgd>(std::move(groups), o);
  } else if (name == "lamb") {
    LambOptions o;
    o.beta1 = config.get_float("optim.beta1");
    o.beta2 = config.get_float("optim.beta2");
    o.eps = config.get_float("optim.eps");
    o.bias_correction = config.get_bool("optim.bias_correction");
    o.trust_clamp = config.get_float("optim.trust_clamp");
    o.norm_group = std::move(norm_group);  // pre-clipping is the trainer's optim.grad_clip
    optimizer = std::make_unique<Lamb>(std::move(groups), o);
  } else {
    LarsOptions o;
    o.momentum = config.get_float("optim.momentum");
    o.trust_coefficient = config.get_float("optim.trust_coefficient");
    o.eps = config.get_float("optim.eps");
    o.trust_clamp = config.get_float("optim.trust_clamp");
    optimizer = std::make_unique<Lars>(std::move(groups), o);
  }
  return optimizer;
}

}  // namespace

int state_slots(const config::Config& config) { return make_algorithm(config, {}, nullptr)->state_slots(); }

std::unique_ptr<Optimizer> make_optimizer(const config::Config& config, const std::vector<Param>& params,
                                          dist::GroupPtr norm_group) {
  auto groups = make_param_groups(params, config.get_string_list("optim.no_decay"),
                                  config.get_float("optim.weight_decay"));
  std::unique_ptr<Optimizer> optimizer = make_algorithm(config, std::move(groups), std::move(norm_group));
  const std::string name = config.get_string("optim.name");
  optimizer->set_lr(config.get_float("optim.lr"));
  const auto& g = optimizer->groups();
  log::infof("optimizer ", name, ": ", g[0].params.size(), " tensors with weight decay ",
             config.get_float("optim.weight_decay"), ", ", g[1].params.size(), " without (optim.no_decay)");
  return optimizer;
}

LrSchedule make_schedule(const config::Config& config, int64_t total_steps) {
  ScheduleOptions o;
  o.kind = LrSchedule::parse_kind(config.get_string("optim.schedule"));
  o.peak_lr = config.get_float("optim.lr");
  o.min_lr = config.get_float("optim.min_lr");
  o.warmup_steps = config.get_int("optim.warmup_steps");
  o.total_steps = total_steps;
  o.power = config.get_float("optim.power");
  o.milestones = config.get_int_list("optim.milestones");
  o.gamma = config.get_float("optim.gamma");
  if (o.min_lr > o.peak_lr) config.fail_at("optim.min_lr", "must not exceed optim.lr");
  if (!std::is_sorted(o.milestones.begin(), o.milestones.end())) {
    config.fail_at("optim.milestones", "must be in ascending order");
  }
  if (o.kind == ScheduleKind::kMultiStep && o.milestones.empty()) {
    config.fail_at("optim.milestones", "is empty but optim.schedule is \"multistep\"");
  }
  return LrSchedule(o);
}

}  // namespace kuafu::optim
