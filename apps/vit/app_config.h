// The kuafu-vit config: its schema (model, data, augmentation, benchmark keys on top of the trainer's)
// and the conversion of the model section into a ViTConfig.
#pragma once

#include "apps/vit/model.h"
#include "core/config/config.h"

namespace kuafu::vit {

config::Schema vit_schema();

// Model shape from the config (field names as Hugging Face's ViTConfig), or from model.init_from's
// config.json.
ViTConfig model_config(const config::Config& config);

}  // namespace kuafu::vit
