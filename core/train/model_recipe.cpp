#include "core/train/model_recipe.h"

#include "core/optim/mixed_precision.h"
#include "core/train/frozen_model.h"
#include "core/train/held_model.h"

namespace kuafu::train {

bool trains(Purpose purpose) { return purpose == Purpose::train || purpose == Purpose::benchmark; }

config::Config section_of(const config::Config& config, const std::string& name) {
  return name.empty() ? config : config.model_view(name);
}

Placing placing_for(const config::Config& config, const std::string& name, const ModelUse& use, bool trained, bool frozen_base) {
  const torch::Device& device = use.options.device;
  Placing placing;
  if (!trains(use.purpose)) {
    // Evaluation, generation and export run the whole model in float32.
    placing.how = Materialization::all_in(device, torch::kFloat32);
  } else if (!trained) {
    placing.how = FrozenModel::materialization_of(config, name, device);
  } else {
    const HeldModel& held = held_model(config, name);
    if (frozen_base) {
      // A frozen base straight in the compute dtype ModelState would cast it to (host memory under
      // memory.offload_frozen); its float32 adapters are made afterwards.
      placing.how = Materialization::all_in(device, compute_dtype(config, device, name));
      if (held.offload_frozen) placing.how.on_host = [](const std::string&) { return true; };
    } else if (held.sharded()) {
      // A float32 copy of the whole model never exists: the strategy fills its chunks as the weights
      // are drawn and read.
      placing.described = true;
      return placing;
    } else {
      placing.how = Materialization::all_in(device, torch::kFloat32);  // masters are made from it
    }
  }
  placing.how.holds = use.holds;
  return placing;
}

}  // namespace kuafu::train
