// Initialisations for models built of Kuafu's layers (which start at zero, or on the meta device, so that a
// model is drawn once, where and when its placement is known): PyTorch's default, Hugging Face's, and a
// model's own rule for each kind of module.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>

#include "core/parallel/tensor/factory.h"

namespace kuafu::nn {

// PyTorch's default initialisation of a model made of linear, convolution and norm layers, as its torch.nn
// layers draw it (diffusers' models start so): each weight of two or more dimensions kaiming-uniform with
// a = √5 and its bias uniform in ±1/√fan_in (fan_in: the weight's size(1) times its kernel's elements), a
// 1-D weight (a norm's) ones and its bias zeros; in named_parameters order, the order the layers were
// made in. Parameters on the meta device go to the WeightSink in scope (parallel::initialize_like_serial).
// Not for embeddings (PyTorch draws those from N(0, 1)) or weights kept [in, out].
void initialize_like_torch(torch::nn::Module& model);

// Hugging Face's initialisation of a language model (GPT-2, OPT, the Llama family): norm weights (those
// `is_norm_weight` names) at one, biases at zero, every other weight from N(0, std_of(name)) (the config's
// initializer_range, 0.02), drawn as the serial model draws them whatever `tp` cuts.
void initialize_like_transformers(torch::nn::Module& model, const parallel::TensorParallel& tp,
                                  const std::function<bool(const std::string& name)>& is_norm_weight,
                                  const std::function<double(const std::string& name)>& std_of);

// A value rule by the module owning a parameter: fills `value` (a float32 CPU tensor of the parameter's whole
// shape) for the parameter `name` (its name in `owner`) and returns true, or returns false to keep the
// parameter as made (zero for one described on the meta device).
using ModuleValueRule = std::function<bool(const torch::nn::Module& owner, const std::string& name, torch::Tensor& value)>;

// Initialises every parameter of `model` by `rule`, in named_parameters order, drawing from torch's default
// CPU generator wherever the parameters live (the same values on any device); parameters on the meta
// device go to the WeightSink in scope (parallel::initialize_like_serial).
void initialize_by_module(torch::nn::Module& model, const ModuleValueRule& rule);

}  // namespace kuafu::nn
