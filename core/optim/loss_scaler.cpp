#include "core/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::optim {

DynamicLossScaler::DynamicLossScaler(LossScalerOptions options)
    : options_(options), scale_(options.initial_scale), hysteresis_left_(options.hysteresis) {
  KUAFU_CHECK(options_.min_scale > 0 && options_.min_scale <= options_.initial_scale &&
                  options_.initial_scale <= options_.max_scale,
              "loss scale: need 0 < min_scale <= initial_scale <= max_scale, got ", options_.min_scale, ", ",
              options_.initial_scale, ", ", options_.max_scale);
  KUAFU_CHECK(options_.growth_factor > 1, "loss scale growth factor must exceed 1, got ", options_.growth_factor);
  KUAFU_CHECK(options_.backoff_factor > 0 && options_.backoff_factor < 1,
              "loss scale back-off factor must be in (0, 1), got ", options_.backoff_factor);
  KUAFU_CHECK(options_.growth_interval >= 1 && options_.hysteresis >= 1,
              "loss scale growth interval and hysteresis must be >= 1");
}

void DynamicLossScaler::update(bool found_inf) {
  if (found_inf) {
    ++skipped_;
    overflows_at_min_ = scale_ <= options_.min_scale ? overflows_at_min_ + 1 : 0;
    KUAFU_CHECK(options_.max_overflows_at_min == 0 || overflows_at_min_ < options_.max_overflows_at_min,
                "the loss scale has stayed at its floor (precision.min_scale = ", options_.min_scale, ") for ",
                overflows_at_min_, " overflowing steps in a row (precision.max_overflows_at_min_scale): the gradients "
                "are inf or NaN whatever the scale, so every step is skipped. The run has diverged; resume from an "
                "earlier checkpoint with a lower learning rate, or train in bf16");
    clean_steps_ = 0;
    hysteresis_left_ = std::max<int64_t>(0, hysteresis_left_ - 1);
    if (hysteresis_left_ == 0) scale_ = std::max(options_.min_scale, scale_ * options_.backoff_factor);
    return;
  }
  overflows_at_min_ = 0;
  if (++clean_steps_ == options_.growth_interval) {
    clean_steps_ = 0;
    hysteresis_left_ = options_.hysteresis;
    scale_ = std::min(options_.max_scale, scale_ * options_.growth_factor);
  }
}

nlohmann::json DynamicLossScaler::state() const {
  return {{"scale", scale_}, {"clean_steps", clean_steps_}, {"hysteresis_left", hysteresis_left_},
          {"skipped_steps", skipped_}, {"overflows_at_min", overflows_at_min_}};
}

void DynamicLossScaler::load_state(const nlohmann::json& state) {
  try {
    const double scale = state.at("scale").get<double>();
    KUAFU_CHECK(std::isfinite(scale) && scale > 0, "loss scaler state: scale ", scale, " is not a positive number");
    scale_ = scale;
    clean_steps_ = state.at("clean_steps").get<int64_t>();
    hysteresis_left_ = state.at("hysteresis_left").get<int64_t>();
    skipped_ = state.at("skipped_steps").get<int64_t>();
    overflows_at_min_ = state.value("overflows_at_min", int64_t{0});  // absent from older checkpoints
  } catch (const nlohmann::json::exception&) {
    fail("loss scaler state: expected a number \"scale\" and whole numbers \"clean_steps\", \"hysteresis_left\" "
         "and \"skipped_steps\", found " + text::abbreviate(state.dump()));
  }
}

}  // namespace kuafu::optim
