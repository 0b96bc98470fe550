// Every dropout of a model turned off (trl's disable_dropout_in_model): a fine-tune whose loss compares the
// trained model with a frozen copy (DPO's log-probability ratios) must not compare a masked forward with an
// unmasked one.
#pragma once

#include <torch/nn/module.h>

namespace kuafu::nn {

// Sets p = 0 in every torch::nn::Dropout (LoRA's included) and every attention core's probability dropout.
void disable_dropout(torch::nn::Module& model);

}  // namespace kuafu::nn
