#include "core/train/held_model.h"

#include "core/util/error.h"

namespace kuafu::train {

const HeldModel& held_model(const config::Config& config, const std::string& name) {
  const std::string& viewed = config.view_of();
  KUAFU_CHECK(viewed.empty() || name.empty() || viewed == name, "model ", name, "'s settings were asked of model ",
              viewed, "'s view of the config");
  const std::string model = name.empty() ? viewed : name;
  return config.once<HeldModel>("held_model:" + model, [&] {
    const config::Config section = model == viewed ? config : config.model_view(model);
    return HeldModel{section.get_string("memory.strategy"), section.get_bool("memory.offload_frozen")};
  });
}

}  // namespace kuafu::train
