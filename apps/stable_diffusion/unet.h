// Stable Diffusion's UNet (diffusers' UNet2DConditionModel) under diffusers' names: the sinusoidal
// timestep embedding (flip_sin_to_cos, freq_shift) through two linear layers; down blocks of ResNet
// blocks with, in CrossAttnDownBlock2D, a Transformer2DModel after each (self-attention, cross-attention
// on the text, GEGLU feed-forward; 1x1-convolution or linear projections in and out); a mid block; up
// blocks that take the down path's outputs as skips; GroupNorm, SiLU and a 3x3 convolution out. SD 1.x
// (convolution projections, 8 heads) and SD 2.x (linear projections, per-block heads, upcast attention)
// are both read from the config.
#pragma once

#include <string>
#include <vector>

#include "apps/stable_diffusion/resnet_block.h"
#include "core/hooks/block_sites.h"
#include "core/nn/cross_attention.h"

namespace kuafu::sd {

// diffusers' UNet2DConditionModel config (SD 1.x's values as defaults).
struct UNetConfig {
  int64_t in_channels = 4, out_channels = 4;
  std::vector<std::string> down_block_types = {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"};
  std::vector<std::string> up_block_types = {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"};
  std::vector<int64_t> block_out_channels = {320, 640, 1280, 1280};
  int64_t layers_per_block = 2;
  int64_t norm_num_groups = 32;
  double norm_eps = 1e-5;
  int64_t cross_attention_dim = 768;
  std::vector<int64_t> heads = {8, 8, 8, 8};  // per block (diffusers' attention_head_dim, or num_attention_heads)
  bool use_linear_projection = false;          // SD 2.x
  bool upcast_attention = false;               // SD 2.x: the attention softmax in float32 under reduced precision
  bool flip_sin_to_cos = true;
  double freq_shift = 0;
  int64_t downsample_padding = 1;
  int64_t sample_size = 64;  // the latents' side the model was trained at (images of sample_size × the VAE's factor)
  // Transformer blocks per Transformer2D, one entry per down block (diffusers' transformer_layers_per_block;
  // the up blocks take them reversed, the mid block the last); empty: one everywhere (SD 1.x and 2.x).
  std::vector<int64_t> transformer_depth;
  // SDXL's "text_time" added conditioning: the pooled text embedding and the size/crop time ids, each id's
  // sinusoidal embedding of addition_time_embed_dim, through add_embedding into the time embedding.
  // Empty: none (SD 1.x and 2.x).
  std::string addition_embed_type;
  int64_t addition_time_embed_dim = 0;
  int64_t projection_class_embeddings_input_dim = 0;  // the pooled text width + time ids × addition_time_embed_dim

  void validate() const;  // kuafu::Error naming the field
  int64_t time_embed_dim() const { return 4 * block_out_channels.front(); }
  int64_t depth(size_t down_block) const { return transformer_depth.empty() ? 1 : transformer_depth[down_block]; }
  bool text_time() const { return addition_embed_type == "text_time"; }
  // Multiply-adds × 2 of one forward pass on latents h × w with `text_tokens` text positions: the
  // convolutions, projections and attention products (norms and activations left out, as MFU does).
  double forward_flops(int64_t h, int64_t w, int64_t text_tokens) const;
  // The parameters the UNet of this config holds, counted without building it.
  int64_t parameter_count() const;
};

// SDXL's added conditioning (diffusers' added_cond_kwargs): text_embeds [B, P], time_ids [B, K].
struct AddedConditions {
  torch::Tensor text_embeds, time_ids;
};

// The sinusoidal embedding [B, dim] of timesteps t [B] (float): diffusers' get_timestep_embedding.
torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t dim, bool flip_sin_to_cos, double freq_shift);

// diffusers' BasicTransformerBlock: LayerNorm + self-attention, LayerNorm + cross-attention on the text,
// LayerNorm + GEGLU feed-forward ("ff.net.0.proj", "ff.net.2"), each residual.
struct BasicTransformerBlockImpl : torch::nn::Module {
  BasicTransformerBlockImpl(int64_t dim, int64_t heads, int64_t cross_attention_dim, const torch::Device& device);
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& context);  // x [B, N, dim], context [B, M, cross]
  parallel::SerialLayerNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
  nn::CrossAttention attn1{nullptr}, attn2{nullptr};
  parallel::SerialLinear geglu{nullptr}, ff_out{nullptr};  // ff.net.0.proj [8 dim, dim], ff.net.2 [dim, 4 dim]
};
TORCH_MODULE(BasicTransformerBlock);

// diffusers' Transformer2DModel on an image: GroupNorm, projection in, `depth` blocks over the H·W
// positions, projection out, plus the input.
struct Transformer2DImpl : torch::nn::Module {
  Transformer2DImpl(const UNetConfig& config, int64_t channels, int64_t heads, int64_t depth, const torch::Device& device);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context);  // [B, C, H, W] -> same
  bool linear;
  nn::GroupNorm norm{nullptr};
  torch::nn::AnyModule proj_in, proj_out;  // 1x1 convolutions, or linear layers (use_linear_projection)
  std::vector<BasicTransformerBlock> blocks;
};
TORCH_MODULE(Transformer2D);

// A down, mid or up block: ResNet blocks, a Transformer2D after each where it has attention, and its
// resampler ("downsamplers.0" / "upsamplers.0").
struct UNetBlockImpl : torch::nn::Module {
  std::vector<ResnetBlock2D> resnets;
  std::vector<Transformer2D> attentions;
  nn::Downsample2D downsample{nullptr};
  nn::Upsample2D upsample{nullptr};
};
TORCH_MODULE(UNetBlock);

// The blocks activation checkpointing takes when memory.checkpoint_blocks names none: every block with
// convolutions or attention at the latents' resolutions.
inline const std::vector<std::string> kUNetCheckpointedBlocks = {"down_blocks.*", "mid_block", "up_blocks.*"};

// Its blocks, for the memory strategies: "time_embedding" (with add_embedding), "conv_in", "down_blocks.<i>", "mid_block",
// "up_blocks.<i>" and "out" (conv_norm_out and conv_out). A down block returns its stream and the skips it
// leaves; an up block takes the skips it uses.
// Made on `device` and initialised as diffusers' model is (PyTorch's layer defaults); on torch::kMeta it
// is described only (lazy construction: no storage, no draws) for materialize() and initialize().
struct UNet2DConditionImpl : torch::nn::Module, hooks::SiteModel {
  explicit UNet2DConditionImpl(const UNetConfig& config, const torch::Device& device = torch::kCPU);
  // PyTorch's draws from the current seed (nn::initialize_like_torch), the same whether made on a device
  // or materialised after being described.
  void initialize();
  // latents [B, in, h, w], timesteps [B] (float or int), text [B, M, cross_attention_dim] -> the
  // prediction [B, out, h, w] (ε, v or x₀, as the scheduler's config says). A "text_time" UNet (SDXL) also
  // takes `added`: the pooled text [B, P] and the time ids [B, K] (original size, crop, target size).
  torch::Tensor forward(const torch::Tensor& latents, const torch::Tensor& timesteps, const torch::Tensor& text,
                        const AddedConditions& added = {});
  torch::nn::Module& module() override { return *this; }
  hooks::BlockSites& block_sites() override { return sites; }

  UNetConfig config;
  nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  parallel::SerialLinear time_linear_1{nullptr}, time_linear_2{nullptr};  // "time_embedding.linear_1", "linear_2"
  parallel::SerialLinear add_linear_1{nullptr}, add_linear_2{nullptr};    // "add_embedding.linear_1", "linear_2" (text_time)
  std::vector<UNetBlock> down_blocks, up_blocks;
  UNetBlock mid_block{nullptr};
  nn::GroupNorm conv_norm_out{nullptr};
  hooks::BlockSites sites;
};
TORCH_MODULE(UNet2DCondition);

}  // namespace kuafu::sd
