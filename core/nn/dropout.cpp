#include "core/nn/dropout.h"

#include <torch/nn/modules/dropout.h>

#include "core/nn/transformer_block.h"

namespace kuafu::nn {

void disable_dropout(torch::nn::Module& model) {
  for (const std::shared_ptr<torch::nn::Module>& module : model.modules()) {
    if (auto* dropout = module->as<torch::nn::DropoutImpl>()) dropout->options.p(0.0);
    if (auto* attention = module->as<AttentionCoreImpl>()) attention->dropout = 0.0;
  }
}

}  // namespace kuafu::nn
