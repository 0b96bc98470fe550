// Dynamic loss scaling for fp16 training: the loss is multiplied by `scale` before backward so small
// gradients survive in half precision; a step whose gradients overflow is skipped and the scale backed
// off, and after `growth_interval` clean steps the scale grows. Hysteresis tolerates isolated overflows.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>

namespace kuafu::optim {

struct LossScalerOptions {
  double initial_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;  // clean steps before the scale grows
  int64_t hysteresis = 2;          // overflows tolerated before the first back-off (reset when the scale grows)
  double min_scale = 1.0;
  double max_scale = 16777216.0;   // 2^24
  // Overflowing steps in a row at min_scale after which the run stops (0: never): there the gradients
  // are inf or NaN whatever the scale, and every step would be skipped for ever.
  int64_t max_overflows_at_min = 50;
};

// Follows Megatron-LM's DynamicGradScaler: on an overflow the growth count restarts and the hysteresis
// budget drops by one; once it is used up, every overflow backs the scale off (not below min_scale) until
// the scale next grows, which refills the budget.
class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(LossScalerOptions options);  // kuafu::Error on inconsistent options

  double scale() const { return scale_; }
  // Records the outcome of one step (`found_inf`: some gradient was inf or NaN, so the step is skipped);
  // kuafu::Error once max_overflows_at_min steps in a row overflowed at the floor.
  void update(bool found_inf);
  int64_t skipped_steps() const { return skipped_; }

  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);  // kuafu::Error naming the missing or bad field

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t clean_steps_ = 0;    // since the last overflow or growth
  int64_t hysteresis_left_;
  int64_t skipped_ = 0;
  int64_t overflows_at_min_ = 0;  // overflowing steps in a row at min_scale
};

}  // namespace kuafu::optim
