// One micro-batch as named features: what a model's head, blocks and tail read of it. A one-stream model
// (a language model, a ViT) reads its `inputs` and `targets`; a model of several streams (AlphaFold)
// names each of its features and labels as its own data does ("msa_feat", "pseudo_beta", ...).
#pragma once

#include <map>
#include <string>
#include <utility>

#include <torch/types.h>

namespace kuafu::hooks {

struct Batch {
  Batch() = default;
  Batch(torch::Tensor inputs, torch::Tensor targets) : inputs(std::move(inputs)), targets(std::move(targets)) {}

  torch::Tensor inputs, targets;                  // what a one-stream model's head and tail take
  std::map<std::string, torch::Tensor> features;  // every further feature, by name

  // The feature `name`: kuafu::Error naming it and the features there are when it is missing.
  const torch::Tensor& operator[](const std::string& name) const;
};

}  // namespace kuafu::hooks
