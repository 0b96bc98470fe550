#include "apps/stable_diffusion/vae.h"

#include <algorithm>
#include <cmath>

#include "core/nn/torch_init.h"
#include "core/util/error.h"

namespace kuafu::sd {

void VaeConfig::validate() const {
  KUAFU_CHECK(in_channels > 0 && out_channels > 0 && latent_channels > 0 && layers_per_block > 0 && norm_num_groups > 0,
              "the VAE's sizes (in_channels, out_channels, latent_channels, layers_per_block, norm_num_groups) must be positive");
  KUAFU_CHECK(!block_out_channels.empty(), "the VAE needs at least one block (block_out_channels)");
  KUAFU_CHECK(sample_size > 0, "the VAE's sample_size (", sample_size, ") must be positive");
  for (const int64_t c : block_out_channels) {
    KUAFU_CHECK(c > 0 && c % norm_num_groups == 0, "block_out_channels ", c, " must be positive and divide into norm_num_groups = ",
                norm_num_groups, " groups");
  }
}

VaeAttentionImpl::VaeAttentionImpl(int64_t channels, int64_t groups, const torch::Device& device)
    : nn::CrossAttentionImpl(nn::CrossAttentionSpec{channels, channels, 1, channels, /*bias=*/true, /*out_bias=*/true, 0.0},
                             parallel::ModelOptions::serial_on(device)) {
  group_norm = register_module("group_norm", nn::GroupNorm(nn::GroupNormSpec{groups, channels, 1e-6, true, device}));
}

torch::Tensor VaeAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const torch::Tensor tokens = group_norm(x).view({b, c, h * w}).transpose(1, 2);  // [B, HW, C]
  const torch::Tensor attended = nn::CrossAttentionImpl::forward(tokens);          // [B, HW, C]
  return attended.transpose(1, 2).reshape({b, c, h, w}) + x;
}

VaeMidBlockImpl::VaeMidBlockImpl(const VaeConfig& config, int64_t channels, const torch::Device& device) {
  auto resnet_list = register_module("resnets", std::make_shared<torch::nn::Module>());
  auto attentions = register_module("attentions", std::make_shared<torch::nn::Module>());
  for (int i = 0; i < 2; ++i) {
    resnets.push_back(resnet_list->register_module(std::to_string(i),
                                                   ResnetBlock2D(ResnetBlockSpec{channels, channels, config.norm_num_groups, 1e-6, 0, 0, device})));
  }
  if (config.mid_block_add_attention) attention = attentions->register_module("0", VaeAttention(channels, config.norm_num_groups, device));
}

torch::Tensor VaeMidBlockImpl::forward(torch::Tensor x) {
  x = resnets[0]->forward(x);
  if (attention) x = attention->forward(x);
  return resnets[1]->forward(x);
}

torch::Tensor VaeStageImpl::forward(torch::Tensor x) {
  for (ResnetBlock2D& resnet : resnets) x = resnet->forward(x);
  if (downsample) x = downsample->forward(x);
  if (upsample) x = upsample->forward(x);
  return x;
}

VaeCoderImpl::VaeCoderImpl(const VaeConfig& c, bool is_encoder, const torch::Device& device) : encoder(is_encoder) {
  const std::vector<int64_t>& widths = c.block_out_channels;
  const auto n = static_cast<int64_t>(widths.size());
  const int64_t inner = is_encoder ? widths.front() : widths.back();  // conv_in's output
  conv_in = register_module("conv_in", nn::Conv2d(nn::Conv2dSpec{is_encoder ? c.in_channels : c.latent_channels, inner, 3, 1, 1, true, device}));
  auto blocks = register_module(is_encoder ? "down_blocks" : "up_blocks", std::make_shared<torch::nn::Module>());
  auto resnet = [&](int64_t in, int64_t out) { return ResnetBlock2D(ResnetBlockSpec{in, out, c.norm_num_groups, 1e-6, 0, 0, device}); };
  if (is_encoder) {
    int64_t out = widths.front();
    for (int64_t i = 0; i < n; ++i) {  // DownEncoderBlock2D: layers_per_block resnets, then stride 2 but the last
      const int64_t in = out;
      out = widths[static_cast<size_t>(i)];
      auto stage = blocks->register_module(std::to_string(i), VaeStage());
      auto list = stage->register_module("resnets", std::make_shared<torch::nn::Module>());
      for (int64_t j = 0; j < c.layers_per_block; ++j) stage->resnets.push_back(list->register_module(std::to_string(j), resnet(j == 0 ? in : out, out)));
      if (i + 1 < n) {
        auto samplers = stage->register_module("downsamplers", std::make_shared<torch::nn::Module>());
        stage->downsample = samplers->register_module("0", nn::Downsample2D(nn::ResampleSpec{out, out, /*padding=*/0, device}));
      }
      stages.push_back(stage);
    }
    mid_block = register_module("mid_block", VaeMidBlock(c, widths.back(), device));
  } else {
    mid_block = register_module("mid_block", VaeMidBlock(c, widths.back(), device));
    int64_t out = widths.back();
    for (int64_t i = 0; i < n; ++i) {  // UpDecoderBlock2D over the widths reversed: layers_per_block + 1 resnets, then ×2 but the last
      const int64_t in = out;
      out = widths[static_cast<size_t>(n - 1 - i)];
      auto stage = blocks->register_module(std::to_string(i), VaeStage());
      auto list = stage->register_module("resnets", std::make_shared<torch::nn::Module>());
      for (int64_t j = 0; j <= c.layers_per_block; ++j) stage->resnets.push_back(list->register_module(std::to_string(j), resnet(j == 0 ? in : out, out)));
      if (i + 1 < n) {
        auto samplers = stage->register_module("upsamplers", std::make_shared<torch::nn::Module>());
        stage->upsample = samplers->register_module("0", nn::Upsample2D(nn::ResampleSpec{out, out, /*padding=*/1, device}));
      }
      stages.push_back(stage);
    }
  }
  const int64_t last = is_encoder ? widths.back() : widths.front();
  conv_norm_out = register_module("conv_norm_out", nn::GroupNorm(nn::GroupNormSpec{c.norm_num_groups, last, 1e-6, true, device}));
  conv_out = register_module("conv_out", nn::Conv2d(nn::Conv2dSpec{last, is_encoder ? 2 * c.latent_channels : c.out_channels, 3, 1, 1, true, device}));
}

torch::Tensor VaeCoderImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = conv_in(x);
  if (encoder) {
    for (VaeStage& stage : stages) h = stage->forward(h);
    h = mid_block->forward(h);
  } else {
    h = mid_block->forward(h);
    for (VaeStage& stage : stages) h = stage->forward(h);
  }
  return conv_out(torch::silu(conv_norm_out(h)));
}

AutoencoderKLImpl::AutoencoderKLImpl(const VaeConfig& c, const torch::Device& device) : config(c) {
  c.validate();
  encoder = register_module("encoder", VaeCoder(c, true, device));
  decoder = register_module("decoder", VaeCoder(c, false, device));
  const int64_t moments = 2 * c.latent_channels;
  if (c.use_quant_conv) quant_conv = register_module("quant_conv", nn::Conv2d(nn::Conv2dSpec{moments, moments, 1, 1, 0, true, device}));
  if (c.use_post_quant_conv) {
    post_quant_conv = register_module("post_quant_conv", nn::Conv2d(nn::Conv2dSpec{c.latent_channels, c.latent_channels, 1, 1, 0, true, device}));
  }
  if (!device.is_meta()) initialize();
}

void AutoencoderKLImpl::initialize() { nn::initialize_like_torch(*this); }

AutoencoderKLImpl::Posterior AutoencoderKLImpl::encode(const torch::Tensor& images) {
  torch::Tensor moments = encoder->forward(images);  // [B, 2L, h, w]
  if (quant_conv) moments = quant_conv(moments);
  const std::vector<torch::Tensor> halves = moments.chunk(2, 1);
  return {halves[0], halves[1].clamp(-30.0, 20.0)};
}

torch::Tensor AutoencoderKLImpl::decode(const torch::Tensor& latents) {
  return decoder->forward(post_quant_conv ? post_quant_conv(latents) : latents);
}

namespace {

// The first `extent` rows (dim 2) or columns (dim 3) of `tile` fade in from the last ones of `before`:
// before · (1 − k/extent) + tile · k/extent at offset k, in place (diffusers' blend_v / blend_h).
void blend(const torch::Tensor& before, torch::Tensor& tile, int64_t dim, int64_t extent) {
  extent = std::min({before.size(dim), tile.size(dim), extent});
  if (extent <= 0) return;
  std::vector<int64_t> shape(4, 1);
  shape[static_cast<size_t>(dim)] = extent;
  const torch::Tensor k = (torch::arange(extent, torch::kFloat64) / static_cast<double>(extent)).to(tile.dtype()).to(tile.device()).view(shape);
  torch::Tensor head = tile.narrow(dim, 0, extent);
  head.copy_(before.narrow(dim, before.size(dim) - extent, extent) * (1 - k) + head * k);
}

}  // namespace

torch::Tensor AutoencoderKLImpl::tiled_decode(const torch::Tensor& latents, int64_t tile) {
  const int64_t latent_tile = tile / config.scale_factor();
  KUAFU_CHECK(latent_tile >= 4, "a decoding tile of ", tile, " pixels is under 4 latents (the VAE's factor is ", config.scale_factor(), ")");
  if (latents.size(2) <= latent_tile && latents.size(3) <= latent_tile) return decode(latents);
  const int64_t stride = latent_tile * 3 / 4;  // latents between tile starts
  const int64_t blend_extent = tile / 4;       // pixels blended with the tile before
  const int64_t kept = tile - blend_extent;    // pixels a tile contributes
  std::vector<std::vector<torch::Tensor>> tiles;  // [row][column] decoded [B, out, ≤tile, ≤tile]
  for (int64_t i = 0; i < latents.size(2); i += stride) {
    tiles.emplace_back();
    for (int64_t j = 0; j < latents.size(3); j += stride) {
      const torch::Tensor part = latents.narrow(2, i, std::min(latent_tile, latents.size(2) - i))
                                     .narrow(3, j, std::min(latent_tile, latents.size(3) - j));
      tiles.back().push_back(decode(part));
    }
  }
  std::vector<torch::Tensor> rows;
  for (size_t i = 0; i < tiles.size(); ++i) {
    std::vector<torch::Tensor> row;
    for (size_t j = 0; j < tiles[i].size(); ++j) {
      torch::Tensor& t = tiles[i][j];  // blended in place: the next row and column blend with this result
      if (i > 0) blend(tiles[i - 1][j], t, 2, blend_extent);
      if (j > 0) blend(tiles[i][j - 1], t, 3, blend_extent);
      row.push_back(t.narrow(2, 0, std::min(kept, t.size(2))).narrow(3, 0, std::min(kept, t.size(3))));
    }
    rows.push_back(torch::cat(row, 3));
  }
  return torch::cat(rows, 2);
}

}  // namespace kuafu::sd
