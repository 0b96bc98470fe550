#include "core/train/held_model.h"

#include "core/memory/disk_tier.h"
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
    HeldModel held{section.get_string("memory.strategy"), section.get_bool("memory.offload_frozen"),
                   section.get_string("memory.disk_dir"), section.get_float("memory.disk_budget_gb"),
                   section.get_bool("memory.disk_read_ahead"), section.get_string("precision.dtype")};
    // The disk tier holds offloaded frozen weights, or the master chunks Gemini's host budget cannot.
    if (!held.disk_dir.empty() && !held.offload_frozen && held.strategy != "gemini") {
      section.fail_at("memory.disk_dir", "holds a frozen model's weights under memory.offload_frozen = true, or Gemini's "
                                         "master chunks under memory.strategy = \"gemini\"; it is set under neither");
    }
    return held;
  });
}

std::optional<memory::DiskTierOptions> disk_tier_options(const config::Config& config, const std::string& name) {
  const HeldModel& held = held_model(config, name);
  if (held.disk_dir.empty()) return std::nullopt;
  memory::DiskTierOptions options;
  options.dir = held.disk_dir;
  options.budget_bytes = static_cast<int64_t>(held.disk_budget_gb * static_cast<double>(int64_t{1} << 30));
  options.read_ahead = held.disk_read_ahead;
  return options;
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
