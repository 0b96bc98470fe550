// Optimizers that tests build by hand over a module's parameters.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "core/optim/algorithms.h"

namespace kuafu::testing {

// AdamW at lr 1e-3 over every parameter of `model`, in one group.
inline std::unique_ptr<optim::Optimizer> adamw_for(torch::nn::Module& model) {
  std::vector<optim::Param> params;
  for (const auto& item : model.named_parameters()) params.push_back({item.key(), item.value(), nullptr, true});
  auto optimizer =
      std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{{"all", params, {}}}, optim::AdamOptions{});
  optimizer->set_lr(1e-3);
  return optimizer;
}

}  // namespace kuafu::testing
