// LoRA (Hu et al., 2021): low-rank adapters on a model's linear layers, applied from outside the model.
// An adapted layer computes y = W x + b + (alpha / r) B A dropout(x) with A [r, in] drawn as
// torch::nn::Linear draws its weights (PEFT's default) and B [out, r] zero, so at first the model's
// outputs are unchanged; every other parameter is frozen. The adapters are children "lora_A" and
// "lora_B" of the adapted layer, PEFT's names (less its adapter name ".default"), so checkpoints,
// adapter folders and merged exports name them as PEFT does.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/io/safetensors.h"

namespace kuafu::nn {

struct LoraSpec {
  int64_t rank = 8;
  double alpha = 16;
  double dropout = 0.0;
  // A layer is adapted when its path within the model is a target or ends with "." + a target
  // (PEFT's target_modules as a list), e.g. "q_proj" or "layers.0.self_attn.q_proj".
  std::vector<std::string> targets = {"q_proj", "v_proj"};
  double scale() const { return alpha / static_cast<double>(rank); }
  // Where the adapters are made (none: beside the adapted layer's weight). A model whose frozen weights
  // were made in host memory (memory.offload_frozen) keeps its trained adapters on the run's device.
  std::optional<torch::Device> device;
};

// Adds adapters to the matching linear layers of every nn::TransformerBlock and nn::CrossAttention
// (to_q, to_k, to_v, to_out.0: diffusers' names) in `model` and freezes
// every other parameter. Returns the adapted layers' paths. kuafu::Error when no layer matches (naming
// the layers there are), or when a matching layer is cut by tensor parallelism.
std::vector<std::string> apply_lora(torch::nn::Module& model, const LoraSpec& spec);

// Whether an adapted layer of `model` keeps its weight as [in, out] (GPT-2's Conv1D): PEFT's fan_in_fan_out.
bool adapts_in_out_layers(const torch::nn::Module& model);

// Whether `name` is an adapter's parameter (".lora_A." or ".lora_B." in it).
bool is_lora_parameter(const std::string& name);

// The model's parameters and buffers as the model without adapters names them, each adapted weight
// with (alpha / r) B A folded in: what a merged export writes. Gives the adapted model's outputs.
io::NamedTensors merged_lora_weights(const torch::nn::Module& model, const LoraSpec& spec);

}  // namespace kuafu::nn
