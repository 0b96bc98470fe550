// Stable Diffusion's VAE (diffusers' AutoencoderKL) under diffusers' names: an encoder of ResNet blocks
// with stride-2 downsampling and a mid block with one self-attention, to the mean and log-variance of a
// diagonal Gaussian over latents (through quant_conv), and the mirrored decoder (after post_quant_conv).
// Latents the UNet sees are samples of that Gaussian times scaling_factor.
#pragma once

#include <vector>

#include "apps/stable_diffusion/resnet_block.h"
#include "core/nn/cross_attention.h"

namespace kuafu::sd {

// diffusers' AutoencoderKL config (down/up blocks DownEncoderBlock2D / UpDecoderBlock2D, SiLU).
struct VaeConfig {
  int64_t in_channels = 3, out_channels = 3, latent_channels = 4;
  std::vector<int64_t> block_out_channels = {128, 256, 512, 512};
  int64_t layers_per_block = 2;
  int64_t norm_num_groups = 32;
  double scaling_factor = 0.18215;
  int64_t sample_size = 32;  // pixels; the tile side of diffusers' tiled decoding (enable_tiling)
  bool mid_block_add_attention = true;
  bool use_quant_conv = true, use_post_quant_conv = true;

  void validate() const;  // kuafu::Error naming the field
  // Pixels per latent along a side: each block but the last halves the image.
  int64_t scale_factor() const { return int64_t{1} << (block_out_channels.size() - 1); }
};

// The mid block's self-attention over the H·W positions (one head of all channels), with its GroupNorm
// and the residual: diffusers' Attention(residual_connection=True) as the VAE builds it.
struct VaeAttentionImpl : nn::CrossAttentionImpl {
  VaeAttentionImpl(int64_t channels, int64_t groups, const torch::Device& device);
  torch::Tensor forward(const torch::Tensor& x);  // [B, C, H, W] -> [B, C, H, W]
  nn::GroupNorm group_norm{nullptr};
};
TORCH_MODULE(VaeAttention);

// UNetMidBlock2D without a timestep: resnet, attention, resnet.
struct VaeMidBlockImpl : torch::nn::Module {
  VaeMidBlockImpl(const VaeConfig& config, int64_t channels, const torch::Device& device);
  torch::Tensor forward(torch::Tensor x);
  std::vector<ResnetBlock2D> resnets;
  VaeAttention attention{nullptr};  // "attentions.0", when mid_block_add_attention
};
TORCH_MODULE(VaeMidBlock);

// A down or up block: its ResNet blocks and its resampler ("downsamplers.0" / "upsamplers.0") unless last.
struct VaeStageImpl : torch::nn::Module {
  std::vector<ResnetBlock2D> resnets;
  nn::Downsample2D downsample{nullptr};
  nn::Upsample2D upsample{nullptr};
  torch::Tensor forward(torch::Tensor x);
};
TORCH_MODULE(VaeStage);

struct VaeCoderImpl : torch::nn::Module {  // the encoder or the decoder
  VaeCoderImpl(const VaeConfig& config, bool encoder, const torch::Device& device);
  torch::Tensor forward(const torch::Tensor& x);
  nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  std::vector<VaeStage> stages;  // "down_blocks.i" or "up_blocks.i", in the order they run
  VaeMidBlock mid_block{nullptr};
  nn::GroupNorm conv_norm_out{nullptr};
  bool encoder;
};
TORCH_MODULE(VaeCoder);

// Made on `device` and initialised as diffusers' model is; on torch::kMeta described only (lazy
// construction) for materialize() and initialize().
struct AutoencoderKLImpl : torch::nn::Module {
  explicit AutoencoderKLImpl(const VaeConfig& config, const torch::Device& device = torch::kCPU);
  void initialize();  // PyTorch's draws from the current seed (nn::initialize_like_torch)

  struct Posterior {
    torch::Tensor mean, logvar;  // [B, latent_channels, H/f, W/f]; logvar clamped to [−30, 20]
    torch::Tensor sample(const torch::Tensor& noise) const { return mean + (0.5 * logvar).exp() * noise; }
  };
  Posterior encode(const torch::Tensor& images);        // images [B, in, H, W] in [−1, 1]
  torch::Tensor decode(const torch::Tensor& latents);   // latents [B, latent, h, w] (unscaled) -> [B, out, H, W]
  // The same in overlapping tiles of `tile` pixels (tile / factor latents, a quarter overlap, the overlap
  // blended linearly): diffusers' tiled_decode, so a large image needs one tile's activations at a time.
  // Latents no larger than a tile decode whole, as diffusers does.
  torch::Tensor tiled_decode(const torch::Tensor& latents, int64_t tile);

  VaeConfig config;
  VaeCoder encoder{nullptr}, decoder{nullptr};
  nn::Conv2d quant_conv{nullptr}, post_quant_conv{nullptr};
};
TORCH_MODULE(AutoencoderKL);

}  // namespace kuafu::sd
