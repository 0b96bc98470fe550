// PyTorch's default initialisation, for models built of Kuafu's layers (which start at zero, or on the
// meta device, so that a model is drawn once, where and when its placement is known).
#pragma once

#include <torch/torch.h>

namespace kuafu::nn {

// PyTorch's default initialisation of a model made of linear, convolution and norm layers, as its torch.nn
// layers draw it (diffusers' models start so): each weight of two or more dimensions kaiming-uniform with
// a = √5 and its bias uniform in ±1/√fan_in (fan_in: the weight's size(1) times its kernel's elements), a
// 1-D weight (a norm's) ones and its bias zeros; in named_parameters order, the order the layers were
// made in. Parameters on the meta device go to the WeightSink in scope (parallel::initialize_like_serial).
// Not for embeddings (PyTorch draws those from N(0, 1)) or weights kept [in, out].
void initialize_like_torch(torch::nn::Module& model);

}  // namespace kuafu::nn
