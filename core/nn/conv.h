// The image layers of diffusion models (Stable Diffusion's UNet and VAE): 2D convolutions, group norms
// and diffusers' Upsample2D / Downsample2D, with diffusers' parameter names so its state dicts map one to one.
#pragma once

#include <vector>

namespace kuafu::nn {

// A 2D convolution: square kernel, the same stride and zero padding along H and W.
struct Conv2dSpec {
  int64_t in = 0, out = 0;  // channels
  int64_t kernel = 3, stride = 1, padding = 0;
  bool bias = true;
  torch::Device device = torch::kCPU;
  torch::Dtype dtype = torch::kFloat32;
};

// torch::nn::Conv2d's parameters and forward, made on spec.device in spec.dtype: "weight" [out, in, kernel,
// kernel] and "bias" [out], zero until the model initialises them (nn::initialize_like_torch). On
// torch::kMeta it is described only (lazy construction), which LibTorch's layers, drawing on the CPU in
// their constructors, cannot be.
// [B, in, H, W] -> [B, out, H', W'], H' = (H + 2 padding - kernel) / stride + 1.
struct Conv2dImpl : torch::nn::Module {
  explicit Conv2dImpl(const Conv2dSpec& spec);
  torch::Tensor forward(const torch::Tensor& x);

  Conv2dSpec spec;
  torch::Tensor weight, bias;
};
TORCH_MODULE(Conv2d);

// GroupNorm over [B, C, ...]: `groups` groups of C / groups channels each. Diffusers uses 32 groups,
// eps 1e-5 (UNet) or 1e-6 (VAE, transformer blocks).
struct GroupNormSpec {
  int64_t groups = 32, channels = 0;
  double eps = 1e-5;
  bool affine = true;  // parameters "weight" (ones) and "bias" (zeros) [C]
  torch::Device device = torch::kCPU;
  torch::Dtype dtype = torch::kFloat32;
};

// torch::nn::GroupNorm's parameters and forward, made on spec.device (torch::kMeta: described only).
struct GroupNormImpl : torch::nn::Module {
  explicit GroupNormImpl(const GroupNormSpec& spec);
  torch::Tensor forward(const torch::Tensor& x);  // [B, C, ...] -> the same

  GroupNormSpec spec;
  torch::Tensor weight, bias;  // undefined unless spec.affine
};
TORCH_MODULE(GroupNorm);

// Channels in and out of an Upsample2D / Downsample2D and where its convolution lives.
struct ResampleSpec {
  int64_t channels = 0;
  int64_t out_channels = 0;  // 0: channels
  // Downsample2D: 1 pads the stride-2 convolution by one on every side (the UNet); 0 pads only the
  // bottom and right by one before an unpadded convolution (the VAE encoder). Upsample2D: the padding
  // of its 3x3 convolution (1 keeps the size).
  int64_t padding = 1;
  torch::Device device = torch::kCPU;
  torch::Dtype dtype = torch::kFloat32;
};

// diffusers.models.upsampling.Upsample2D(channels, use_conv=True, out_channels, padding): nearest-
// neighbour upsampling then a 3x3 convolution "conv".
struct Upsample2DImpl : torch::nn::Module {
  explicit Upsample2DImpl(const ResampleSpec& spec);
  // x [B, C, H, W] -> [B, C_out, 2H, 2W]; `output_size` {H', W'} instead of doubling (diffusers'
  // output_size: the UNet passes its skip connection's size when an odd size was halved on the way down).
  torch::Tensor forward(const torch::Tensor& x, const std::vector<int64_t>& output_size = {});

  ResampleSpec spec;
  Conv2d conv{nullptr};
};
TORCH_MODULE(Upsample2D);

// diffusers.models.downsampling.Downsample2D(channels, use_conv=True, out_channels, padding): a 3x3
// stride-2 convolution "conv".
struct Downsample2DImpl : torch::nn::Module {
  explicit Downsample2DImpl(const ResampleSpec& spec);
  // x [B, C, H, W] -> [B, C_out, ceil(H/2), ceil(W/2)] with padding 1, [B, C_out, floor(H/2), floor(W/2)] with 0.
  torch::Tensor forward(const torch::Tensor& x);

  ResampleSpec spec;
  Conv2d conv{nullptr};
};
TORCH_MODULE(Downsample2D);

}  // namespace kuafu::nn
