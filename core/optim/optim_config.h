// The optim.* config keys and what they build: parameter groups (by name patterns), the optimizer
// (adamw, adam, sgd, lamb, lars) and the learning-rate schedule.
#pragma once

#include <memory>

#include "core/config/config.h"
#include "core/optim/algorithms.h"
#include "core/optim/lr_schedule.h"

namespace kuafu::optim {

void add_optimizer_schema(config::Schema& schema);

// Two groups: "decay" and "no_decay". A parameter whose name matches one of `no_decay_patterns` (shell
// globs, e.g. "*.bias") joins no_decay: no weight decay and no LAMB/LARS trust scaling.
std::vector<ParamGroup> make_param_groups(const std::vector<Param>& params,
                                          const std::vector<std::string>& no_decay_patterns, double weight_decay);

// The optimizer optim.name names, over `params` grouped by optim.no_decay. `norm_group`: the ranks
// across which global gradient norms are summed (null for plain data parallelism).
std::unique_ptr<Optimizer> make_optimizer(const config::Config& config, const std::vector<Param>& params,
                                          dist::GroupPtr norm_group = nullptr);

// The state tensors per parameter that optim.name's algorithm keeps (Adam: 2), before any optimizer exists
// (Gemini sizes the disk tier's chunk files by it).
int state_slots(const config::Config& config);

LrSchedule make_schedule(const config::Config& config, int64_t total_steps);

}  // namespace kuafu::optim
