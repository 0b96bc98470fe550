#include "core/train/held_model.h"

#include "core/optim/mixed_precision.h"
#include "core/util/error.h"

namespace kuafu::train {
namespace {

// The name of the model `config` reads for `name` and that model's section.
std::string model_named(const config::Config& config, const std::string& name) {
  const std::string& viewed = config.view_of();
  KUAFU_CHECK(viewed.empty() || name.empty() || viewed == name, "model ", name, "'s settings were asked of model ",
              viewed, "'s view of the config");
  return name.empty() ? viewed : name;
}

config::Config section_named(const config::Config& config, const std::string& model) {
  return model == config.view_of() ? config : config.model_view(model);
}

}  // namespace

const HeldModel& held_model(const config::Config& config, const std::string& name) {
  const std::string model = model_named(config, name);
  return config.once<HeldModel>("held_model:" + model, [&] {
    const config::Config section = section_named(config, model);
    return HeldModel{section.get_string("memory.strategy"), section.get_bool("memory.offload_frozen"),
                     section.get_string("precision.dtype")};
  });
}

c10::ScalarType compute_dtype(const config::Config& config, const c10::Device& device, const std::string& name) {
  const HeldModel& held = held_model(config, name);
  if (held.precision == "fp16" && !device.is_cuda()) {
    section_named(config, model_named(config, name))
        .fail_at("precision.dtype", "is \"fp16\" but the device is the CPU, where LibTorch lacks half-precision "
                                    "kernels; use \"bf16\" on the CPU");
  }
  return optim::dtype_named(held.precision);
}

}  // namespace kuafu::train
