// diffusers' ResnetBlock2D (the VAE's and the UNet's): GroupNorm, SiLU, 3x3 convolution, twice, with the
// timestep embedding added between them where there is one (the UNet's time_emb_proj), and a 1x1
// convolution on the shortcut when the channels change. Parameter names are diffusers'.
#pragma once

#include "core/nn/conv.h"
#include "core/parallel/tensor/factory.h"

namespace kuafu::sd {

struct ResnetBlockSpec {
  int64_t in = 0, out = 0;       // channels
  int64_t groups = 32;
  double eps = 1e-6;             // the VAE's; the UNet's is 1e-5
  int64_t time_channels = 0;     // 0: no timestep embedding (the VAE)
  double dropout = 0;
  torch::Device device = torch::kCPU;  // torch::kMeta: described only (lazy construction)
};

struct ResnetBlock2DImpl : torch::nn::Module {
  explicit ResnetBlock2DImpl(const ResnetBlockSpec& spec);
  // x [B, in, H, W], time [B, time_channels] (undefined without one) -> [B, out, H, W].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& time = {});

  ResnetBlockSpec spec;
  nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv_shortcut{nullptr};
  parallel::SerialLinear time_emb_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(ResnetBlock2D);

}  // namespace kuafu::sd
