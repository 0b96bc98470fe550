#include "apps/stable_diffusion/unet.h"

#include <algorithm>
#include <cmath>

#include "core/nn/torch_init.h"
#include "core/util/error.h"

namespace kuafu::sd {

namespace {

bool has_attention(const std::string& block_type) { return block_type.rfind("CrossAttn", 0) == 0; }

// A registered child list ("resnets", "attentions", ...) of `parent`.
std::shared_ptr<torch::nn::Module> child_list(torch::nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>());
}

parallel::SerialLinear linear(int64_t in, int64_t out, const torch::Device& device) {
  return parallel::SerialLinear(parallel::LinearSpec{in, out}, device);
}

}  // namespace

void UNetConfig::validate() const {
  const size_t n = block_out_channels.size();
  KUAFU_CHECK(n > 0 && down_block_types.size() == n && up_block_types.size() == n && heads.size() == n,
              "the UNet needs one down block type, up block type and head count per block_out_channels entry (",
              block_out_channels.size(), ")");
  for (size_t i = 0; i < n; ++i) {
    const int64_t c = block_out_channels[i];
    KUAFU_CHECK(c > 0 && c % norm_num_groups == 0, "block_out_channels ", c, " must divide into norm_num_groups = ", norm_num_groups,
                " groups");
    KUAFU_CHECK(heads[i] > 0 && c % heads[i] == 0, "block ", i, "'s ", heads[i], " attention heads must divide its ", c, " channels");
    KUAFU_CHECK(down_block_types[i] == "CrossAttnDownBlock2D" || down_block_types[i] == "DownBlock2D", "down block type \"",
                down_block_types[i], "\" is not CrossAttnDownBlock2D or DownBlock2D");
    KUAFU_CHECK(up_block_types[i] == "CrossAttnUpBlock2D" || up_block_types[i] == "UpBlock2D", "up block type \"", up_block_types[i],
                "\" is not CrossAttnUpBlock2D or UpBlock2D");
  }
  KUAFU_CHECK(transformer_depth.empty() || transformer_depth.size() == n, "transformer_layers_per_block needs one entry per block (",
              n, "), not ", transformer_depth.size());
  for (const int64_t d : transformer_depth) KUAFU_CHECK(d > 0 && d <= 1024, "transformer_layers_per_block ", d, " must lie in [1, 1024]");
  KUAFU_CHECK(addition_embed_type.empty() || text_time(), "addition_embed_type \"", addition_embed_type,
              "\" is not supported (only SDXL's \"text_time\")");
  KUAFU_CHECK(!text_time() || (addition_time_embed_dim > 0 && projection_class_embeddings_input_dim > 0),
              "addition_embed_type \"text_time\" needs positive addition_time_embed_dim and projection_class_embeddings_input_dim");
  KUAFU_CHECK(layers_per_block > 0 && cross_attention_dim > 0 && in_channels > 0 && out_channels > 0,
              "the UNet's layers_per_block, cross_attention_dim and channels must be positive");
  // 2^16 latents a side (half a million pixels) is beyond any UNet trained; 1e9 overflowed LibTorch's sizes.
  KUAFU_CHECK(sample_size > 0 && sample_size <= (1 << 16), "sample_size ", sample_size, " must lie in [1, 65536] latents");
  // A lower bound of the parameter count, in double (widths of 1e9 overflow int64): each down block's
  // resnets hold 3x3 convolutions of its width. Past 10^12 parameters (4 TB in float32) no machine holds
  // the model, and building it would only fill memory: a typo in config.json.
  double least = 0;
  for (const int64_t c : block_out_channels) least += static_cast<double>(layers_per_block) * 9.0 * static_cast<double>(c) * static_cast<double>(c);
  KUAFU_CHECK(least <= 1e12, "block_out_channels up to ", *std::max_element(block_out_channels.begin(), block_out_channels.end()),
              " with layers_per_block = ", layers_per_block, " make at least ", least,
              " parameters, more than any machine holds (10^12)");
}

double UNetConfig::forward_flops(int64_t h, int64_t w, int64_t text_tokens) const {
  const double m = static_cast<double>(text_tokens), d = static_cast<double>(cross_attention_dim);
  double flops = 0;
  auto conv = [&](double in, double out, double k, double positions) { flops += 2 * in * out * k * k * positions; };
  auto resnet = [&](double in, double out, double positions) {
    conv(in, out, 3, positions);
    conv(out, out, 3, positions);
    if (in != out) conv(in, out, 1, positions);
  };
  auto transformer = [&](double c, double n, int64_t depth) {
    flops += 2 * 2 * c * c * n;  // projections in and out
    for (int64_t b = 0; b < depth; ++b) {
      flops += 2 * 4 * c * c * n + 2 * 2 * n * n * c;                      // self-attention: q, k, v, out; scores and values
      flops += 2 * 2 * c * c * n + 2 * 2 * d * c * m + 2 * 2 * n * m * c;  // cross-attention
      flops += 2 * (8 * c * c + 4 * c * c) * n;                            // GEGLU feed-forward
    }
  };
  const size_t blocks = block_out_channels.size();
  double positions = static_cast<double>(h * w), side_h = static_cast<double>(h), side_w = static_cast<double>(w);
  conv(static_cast<double>(in_channels), static_cast<double>(block_out_channels.front()), 3, positions);
  std::vector<double> skip_widths = {static_cast<double>(block_out_channels.front())};
  double width = static_cast<double>(block_out_channels.front());
  for (size_t i = 0; i < blocks; ++i) {
    const double out = static_cast<double>(block_out_channels[i]);
    for (int64_t j = 0; j < layers_per_block; ++j) {
      resnet(j == 0 ? width : out, out, positions);
      if (has_attention(down_block_types[i])) transformer(out, positions, depth(i));
      skip_widths.push_back(out);
    }
    width = out;
    if (i + 1 < blocks) {
      side_h = std::ceil(side_h / 2);
      side_w = std::ceil(side_w / 2);
      positions = side_h * side_w;
      conv(out, out, 3, positions);
      skip_widths.push_back(out);
    }
  }
  resnet(width, width, positions);
  transformer(width, positions, depth(blocks - 1));
  resnet(width, width, positions);
  for (size_t i = 0; i < blocks; ++i) {
    const double out = static_cast<double>(block_out_channels[blocks - 1 - i]);
    for (int64_t j = 0; j <= layers_per_block; ++j) {
      resnet(width + skip_widths.back(), out, positions);
      skip_widths.pop_back();
      width = out;
      if (has_attention(up_block_types[i])) transformer(out, positions, depth(blocks - 1 - i));
    }
    if (i + 1 < blocks) {
      side_h *= 2;  // odd sizes come back to the skip's: close enough for a FLOP count
      side_w *= 2;
      positions = side_h * side_w;
      conv(out, out, 3, positions);
    }
  }
  conv(width, static_cast<double>(out_channels), 3, positions);
  return flops;
}

int64_t UNetConfig::parameter_count() const {
  const int64_t t = time_embed_dim(), d = cross_attention_dim;
  auto conv = [](int64_t in, int64_t out, int64_t k) { return in * out * k * k + out; };
  auto resnet = [&](int64_t in, int64_t out) {
    return 2 * in + conv(in, out, 3) + t * out + out + 2 * out + conv(out, out, 3) + (in != out ? conv(in, out, 1) : 0);
  };
  auto transformer = [&](int64_t c, int64_t depth) {
    const int64_t attention = 3 * c * c + c * c + c;  // q, k, v without bias; out with
    const int64_t cross = c * c + 2 * d * c + c * c + c;
    return 2 * c + 2 * conv(c, c, 1) + depth * (3 * 2 * c + attention + cross + (c * 8 * c + 8 * c) + (4 * c * c + c));
  };
  const auto n = block_out_channels.size();
  const int64_t c0 = block_out_channels.front();
  int64_t count = conv(in_channels, c0, 3) + (c0 * t + t) + (t * t + t) + 2 * c0 + conv(c0, out_channels, 3);
  if (text_time()) count += (projection_class_embeddings_input_dim * t + t) + (t * t + t);
  std::vector<int64_t> skips = {c0};
  int64_t width = c0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t out = block_out_channels[i];
    for (int64_t j = 0; j < layers_per_block; ++j) {
      count += resnet(j == 0 ? width : out, out) + (has_attention(down_block_types[i]) ? transformer(out, depth(i)) : 0);
      skips.push_back(out);
    }
    width = out;
    if (i + 1 < n) {
      count += conv(out, out, 3);
      skips.push_back(out);
    }
  }
  count += 2 * resnet(width, width) + transformer(width, depth(n - 1));
  for (size_t i = 0; i < n; ++i) {
    const int64_t out = block_out_channels[n - 1 - i];
    for (int64_t j = 0; j <= layers_per_block; ++j) {
      count += resnet(width + skips.back(), out) + (has_attention(up_block_types[i]) ? transformer(out, depth(n - 1 - i)) : 0);
      skips.pop_back();
      width = out;
    }
    if (i + 1 < n) count += conv(out, out, 3);
  }
  return count;
}

torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t dim, bool flip_sin_to_cos, double freq_shift) {
  const int64_t half = dim / 2;
  const auto f32 = t.options().dtype(torch::kFloat32);
  const torch::Tensor exponent = -std::log(10000.0) * torch::arange(half, f32) / (static_cast<double>(half) - freq_shift);
  const torch::Tensor angles = t.to(torch::kFloat32).unsqueeze(1) * exponent.exp().unsqueeze(0);  // [B, half]
  torch::Tensor emb = flip_sin_to_cos ? torch::cat({angles.cos(), angles.sin()}, 1) : torch::cat({angles.sin(), angles.cos()}, 1);
  if (dim % 2 == 1) emb = torch::constant_pad_nd(emb, {0, 1});
  return emb;  // [B, dim]
}

BasicTransformerBlockImpl::BasicTransformerBlockImpl(int64_t dim, int64_t heads, int64_t cross_attention_dim, const torch::Device& device) {
  auto norm = [&](const char* name) { return register_module(name, parallel::SerialLayerNorm(dim, 1e-5, device)); };
  auto attention = [&](const char* name, int64_t context) {
    const nn::CrossAttentionSpec spec{dim, context, heads, dim / heads, /*bias=*/false, /*out_bias=*/true, 0.0};
    return register_module(name, nn::CrossAttention(spec, parallel::ModelOptions::serial_on(device)));
  };
  norm1 = norm("norm1");
  attn1 = attention("attn1", dim);
  norm2 = norm("norm2");
  attn2 = attention("attn2", cross_attention_dim);
  norm3 = norm("norm3");
  // "ff.net.0.proj" (GEGLU's projection to the value and its gate) and "ff.net.2" (net.1 is a dropout).
  auto ff = register_module("ff", std::make_shared<torch::nn::Module>());
  auto net = ff->register_module("net", std::make_shared<torch::nn::Module>());
  geglu = net->register_module("0", std::make_shared<torch::nn::Module>())->register_module("proj", linear(dim, 8 * dim, device));
  ff_out = net->register_module("2", linear(4 * dim, dim, device));
}

torch::Tensor BasicTransformerBlockImpl::forward(torch::Tensor x, const torch::Tensor& context) {
  x = attn1->forward(norm1(x)) + x;
  x = attn2->forward(norm2(x), context) + x;
  const std::vector<torch::Tensor> value_gate = geglu(norm3(x)).chunk(2, -1);  // [B, N, 4 dim] each
  return ff_out(value_gate[0] * torch::gelu(value_gate[1])) + x;
}

Transformer2DImpl::Transformer2DImpl(const UNetConfig& c, int64_t channels, int64_t heads, int64_t depth, const torch::Device& device)
    : linear(c.use_linear_projection) {
  norm = register_module("norm", nn::GroupNorm(nn::GroupNormSpec{c.norm_num_groups, channels, 1e-6, true, device}));
  auto projection = [&](const char* name) {
    torch::nn::AnyModule layer = linear ? torch::nn::AnyModule(sd::linear(channels, channels, device))
                                        : torch::nn::AnyModule(nn::Conv2d(nn::Conv2dSpec{channels, channels, 1, 1, 0, true, device}));
    register_module(name, layer.ptr());
    return layer;
  };
  proj_in = projection("proj_in");
  auto list = child_list(*this, "transformer_blocks");
  for (int64_t b = 0; b < depth; ++b) {
    blocks.push_back(list->register_module(std::to_string(b), BasicTransformerBlock(channels, heads, c.cross_attention_dim, device)));
  }
  proj_out = projection("proj_out");
}

torch::Tensor Transformer2DImpl::forward(const torch::Tensor& x, const torch::Tensor& context) {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  torch::Tensor y = norm(x);
  auto to_tokens = [&](const torch::Tensor& image) { return image.permute({0, 2, 3, 1}).reshape({b, h * w, c}); };  // [B, HW, C]
  auto to_image = [&](const torch::Tensor& tokens) { return tokens.reshape({b, h, w, c}).permute({0, 3, 1, 2}); };  // [B, C, H, W]
  y = linear ? proj_in.forward(to_tokens(y)) : to_tokens(proj_in.forward(y));
  for (BasicTransformerBlock& block : blocks) y = block->forward(y, context);
  y = linear ? to_image(proj_out.forward(y)) : proj_out.forward(to_image(y).contiguous());
  return y + x;
}

UNet2DConditionImpl::UNet2DConditionImpl(const UNetConfig& c, const torch::Device& device) : config(c) {
  c.validate();
  const std::vector<int64_t>& widths = c.block_out_channels;
  const auto n = static_cast<int64_t>(widths.size());
  const int64_t time_dim = c.time_embed_dim();
  conv_in = register_module("conv_in", nn::Conv2d(nn::Conv2dSpec{c.in_channels, widths.front(), 3, 1, 1, true, device}));
  auto time_embedding = register_module("time_embedding", std::make_shared<torch::nn::Module>());
  time_linear_1 = time_embedding->register_module("linear_1", linear(widths.front(), time_dim, device));
  time_linear_2 = time_embedding->register_module("linear_2", linear(time_dim, time_dim, device));
  if (c.text_time()) {
    auto add_embedding = register_module("add_embedding", std::make_shared<torch::nn::Module>());
    add_linear_1 = add_embedding->register_module("linear_1", linear(c.projection_class_embeddings_input_dim, time_dim, device));
    add_linear_2 = add_embedding->register_module("linear_2", linear(time_dim, time_dim, device));
  }
  auto resnet = [&](int64_t in, int64_t out) {
    return ResnetBlock2D(ResnetBlockSpec{in, out, c.norm_num_groups, c.norm_eps, time_dim, 0, device});
  };
  auto add_attention = [&](UNetBlock& block, int64_t j, int64_t channels, size_t down_block) {
    auto list = block->named_children().contains("attentions") ? block->named_children()["attentions"] : child_list(*block, "attentions");
    block->attentions.push_back(list->register_module(
        std::to_string(j), Transformer2D(c, channels, c.heads[down_block], c.depth(down_block), device)));
  };

  auto downs = child_list(*this, "down_blocks");
  int64_t out = widths.front();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t in = out;
    out = widths[static_cast<size_t>(i)];
    UNetBlock block = downs->register_module(std::to_string(i), UNetBlock());
    auto resnets = child_list(*block, "resnets");
    for (int64_t j = 0; j < c.layers_per_block; ++j) {
      block->resnets.push_back(resnets->register_module(std::to_string(j), resnet(j == 0 ? in : out, out)));
      if (has_attention(c.down_block_types[static_cast<size_t>(i)])) add_attention(block, j, out, static_cast<size_t>(i));
    }
    if (i + 1 < n) {
      block->downsample = child_list(*block, "downsamplers")
                              ->register_module("0", nn::Downsample2D(nn::ResampleSpec{out, out, c.downsample_padding, device}));
    }
    down_blocks.push_back(block);
  }

  mid_block = register_module("mid_block", UNetBlock());
  auto mid_resnets = child_list(*mid_block, "resnets");
  for (int j = 0; j < 2; ++j) mid_block->resnets.push_back(mid_resnets->register_module(std::to_string(j), resnet(widths.back(), widths.back())));
  add_attention(mid_block, 0, widths.back(), widths.size() - 1);

  auto ups = child_list(*this, "up_blocks");
  out = widths.back();
  for (int64_t i = 0; i < n; ++i) {  // the widths reversed; each resnet takes the matching skip too
    const int64_t previous = out;
    out = widths[static_cast<size_t>(n - 1 - i)];
    const int64_t skip_in = widths[static_cast<size_t>(std::max<int64_t>(n - 2 - i, 0))];  // the block input's width on the way down
    UNetBlock block = ups->register_module(std::to_string(i), UNetBlock());
    auto resnets = child_list(*block, "resnets");
    for (int64_t j = 0; j <= c.layers_per_block; ++j) {
      const int64_t skip = j == c.layers_per_block ? skip_in : out;
      block->resnets.push_back(resnets->register_module(std::to_string(j), resnet((j == 0 ? previous : out) + skip, out)));
      if (has_attention(c.up_block_types[static_cast<size_t>(i)])) add_attention(block, j, out, static_cast<size_t>(n - 1 - i));
    }
    if (i + 1 < n) {
      block->upsample = child_list(*block, "upsamplers")->register_module("0", nn::Upsample2D(nn::ResampleSpec{out, out, 1, device}));
    }
    up_blocks.push_back(block);
  }
  conv_norm_out = register_module("conv_norm_out", nn::GroupNorm(nn::GroupNormSpec{c.norm_num_groups, widths.front(), c.norm_eps, true, device}));
  conv_out = register_module("conv_out", nn::Conv2d(nn::Conv2dSpec{widths.front(), c.out_channels, 3, 1, 1, true, device}));

  std::vector<hooks::ModelPart> blocks = {{"time_embedding", {"time_embedding"}}, {"conv_in", {"conv_in"}}};
  if (c.text_time()) blocks.front().modules.push_back("add_embedding");
  for (int64_t i = 0; i < n; ++i) blocks.push_back({"down_blocks." + std::to_string(i), {"down_blocks." + std::to_string(i)}});
  blocks.push_back({"mid_block", {"mid_block"}});
  for (int64_t i = 0; i < n; ++i) blocks.push_back({"up_blocks." + std::to_string(i), {"up_blocks." + std::to_string(i)}});
  blocks.push_back({"out", {"conv_norm_out", "conv_out"}});
  sites = hooks::BlockSites::of_parts(*this, blocks);
  if (!device.is_meta()) initialize();
}

void UNet2DConditionImpl::initialize() { nn::initialize_like_torch(*this); }

torch::Tensor UNet2DConditionImpl::forward(const torch::Tensor& latents, const torch::Tensor& timesteps, const torch::Tensor& text,
                                           const AddedConditions& added) {
  using hooks::Tensors;
  const int64_t batch = latents.size(0);
  const torch::Tensor t = timesteps.dim() == 0 ? timesteps.expand({batch}) : timesteps;
  const torch::Tensor time_in = timestep_embedding(t.to(latents.device()), config.block_out_channels.front(), config.flip_sin_to_cos,
                                                   config.freq_shift).to(latents.scalar_type());
  Tensors time_inputs = {time_in};
  if (config.text_time()) {
    const torch::Tensor& pooled = added.text_embeds;
    const torch::Tensor& ids = added.time_ids;
    KUAFU_CHECK(pooled.defined() && ids.defined() && pooled.dim() == 2 && ids.dim() == 2 && pooled.size(0) == batch && ids.size(0) == batch,
                "an SDXL UNet (addition_embed_type \"text_time\") takes the pooled text [", batch, ", P] and the time ids [", batch,
                ", K] of each latent");
    KUAFU_CHECK(pooled.size(1) + ids.size(1) * config.addition_time_embed_dim == config.projection_class_embeddings_input_dim,
                "the UNet's projection_class_embeddings_input_dim is ", config.projection_class_embeddings_input_dim, ", not the pooled text's ",
                pooled.size(1), " + ", ids.size(1), " time ids x addition_time_embed_dim ", config.addition_time_embed_dim);
    // Each id's sinusoidal embedding, after the pooled text: [B, P + K·addition_time_embed_dim].
    const torch::Tensor ids_in = timestep_embedding(ids.reshape({-1}).to(latents.device()), config.addition_time_embed_dim,
                                                    config.flip_sin_to_cos, config.freq_shift).reshape({batch, -1});
    time_inputs.push_back(torch::cat({pooled.to(latents.device()), ids_in}, 1).to(latents.scalar_type()));
  }
  const torch::Tensor time = sites.call("time_embedding", time_inputs, [this](const Tensors& in) {
    torch::Tensor embedded = time_linear_2(torch::silu(time_linear_1(in[0])));  // [B, 4 C0]
    if (in.size() > 1) embedded = embedded + add_linear_2(torch::silu(add_linear_1(in[1])));
    return Tensors{embedded};
  })[0];
  torch::Tensor x = sites.call(*conv_in, latents, [this](const torch::Tensor& in) { return conv_in(in); });
  std::vector<torch::Tensor> skips = {x};
  for (UNetBlock& block : down_blocks) {
    // {stream, skips left on the way}: one skip per ResNet block and one after the downsampler.
    const Tensors out = sites.call(*block, {x, time, text}, [block = block.get()](const Tensors& in) {
      torch::Tensor y = in[0];
      Tensors result = {y};
      for (size_t j = 0; j < block->resnets.size(); ++j) {
        y = block->resnets[j]->forward(y, in[1]);
        if (!block->attentions.empty()) y = block->attentions[j]->forward(y, in[2]);
        result.push_back(y);
      }
      if (block->downsample) result.push_back(y = block->downsample->forward(y));
      result[0] = y;
      return result;
    });
    x = out[0];
    skips.insert(skips.end(), out.begin() + 1, out.end());
  }
  x = sites.call(*mid_block, {x, time, text}, [this](const Tensors& in) {
    const torch::Tensor y = mid_block->attentions[0]->forward(mid_block->resnets[0]->forward(in[0], in[1]), in[2]);
    return Tensors{mid_block->resnets[1]->forward(y, in[1])};
  })[0];
  for (UNetBlock& block : up_blocks) {
    // {stream, time, text, the skips it takes (last first), and where the upsampler aims}.
    Tensors in = {x, time, text};
    const size_t uses = block->resnets.size();
    for (size_t j = 0; j < uses; ++j) in.push_back(skips[skips.size() - 1 - j]);
    skips.resize(skips.size() - uses);
    // An odd size halved on the way down comes back to the next skip's size, not twice this one.
    const std::vector<int64_t> up_to = skips.empty() ? std::vector<int64_t>{} : std::vector<int64_t>{skips.back().size(2), skips.back().size(3)};
    x = sites.call(*block, in, [block = block.get(), up_to](const Tensors& in) {
      torch::Tensor y = in[0];
      for (size_t j = 0; j < block->resnets.size(); ++j) {
        y = block->resnets[j]->forward(torch::cat({y, in[3 + j]}, 1), in[1]);
        if (!block->attentions.empty()) y = block->attentions[j]->forward(y, in[2]);
      }
      return Tensors{block->upsample ? block->upsample->forward(y, up_to) : y};
    })[0];
  }
  return sites.call("out", x, [this](const torch::Tensor& in) { return conv_out(torch::silu(conv_norm_out(in))); });
}

}  // namespace kuafu::sd
