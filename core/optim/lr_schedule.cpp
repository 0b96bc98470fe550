#include "core/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/util/error.h"

namespace kuafu::optim {

const std::vector<std::string>& LrSchedule::kind_names() {
  static const std::vector<std::string> names = {"constant", "cosine", "linear", "polynomial", "multistep"};
  return names;
}

ScheduleKind LrSchedule::parse_kind(const std::string& name) {
  const auto& names = kind_names();
  const auto found = std::find(names.begin(), names.end(), name);
  KUAFU_CHECK(found != names.end(), "unknown learning-rate schedule '", name, "'");
  return static_cast<ScheduleKind>(found - names.begin());
}

LrSchedule::LrSchedule(ScheduleOptions options) : options_(std::move(options)) {
  KUAFU_CHECK(options_.peak_lr >= 0 && options_.min_lr >= 0, "learning rates must not be negative");
  KUAFU_CHECK(options_.min_lr <= options_.peak_lr, "the final learning rate (", options_.min_lr,
              ") exceeds the peak (", options_.peak_lr, ")");
  KUAFU_CHECK(options_.warmup_steps >= 0 && options_.total_steps >= 1, "warm-up steps must be >= 0 and total >= 1");
  KUAFU_CHECK(options_.power > 0, "the polynomial power must be positive");
  KUAFU_CHECK(std::is_sorted(options_.milestones.begin(), options_.milestones.end()),
              "multi-step milestones must be in ascending order");
}

double LrSchedule::lr(int64_t step) const {
  const auto& o = options_;
  if (step < o.warmup_steps) {
    return o.peak_lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps + 1);
  }
  // Fraction of the decay phase done: 0 right after warm-up, 1 at total_steps and beyond.
  const int64_t decay_steps = o.total_steps - o.warmup_steps;
  const double progress =
      decay_steps > 0 ? std::min(1.0, static_cast<double>(step - o.warmup_steps) / static_cast<double>(decay_steps))
                      : 1.0;
  switch (o.kind) {
    case ScheduleKind::kConstant:
      return o.peak_lr;
    case ScheduleKind::kCosine:
      return o.min_lr + 0.5 * (o.peak_lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
    case ScheduleKind::kLinear:
      return o.min_lr + (o.peak_lr - o.min_lr) * (1.0 - progress);
    case ScheduleKind::kPolynomial:
      return o.min_lr + (o.peak_lr - o.min_lr) * std::pow(1.0 - progress, o.power);
    case ScheduleKind::kMultiStep: {
      const auto passed = std::upper_bound(o.milestones.begin(), o.milestones.end(), step) - o.milestones.begin();
      return o.peak_lr * std::pow(o.gamma, static_cast<double>(passed));
    }
  }
  return o.peak_lr;
}

}  // namespace kuafu::optim
