#include "apps/stable_diffusion/resnet_block.h"

namespace kuafu::sd {

ResnetBlock2DImpl::ResnetBlock2DImpl(const ResnetBlockSpec& s) : spec(s) {
  auto norm = [&](int64_t channels) { return nn::GroupNorm(nn::GroupNormSpec{s.groups, channels, s.eps, true, s.device}); };
  norm1 = register_module("norm1", norm(s.in));
  conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dSpec{s.in, s.out, 3, 1, 1, true, s.device}));
  if (s.time_channels > 0) {
    time_emb_proj = register_module("time_emb_proj", parallel::SerialLinear(parallel::LinearSpec{s.time_channels, s.out}, s.device));
  }
  norm2 = register_module("norm2", norm(s.out));
  dropout = register_module("dropout", torch::nn::Dropout(s.dropout));
  conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dSpec{s.out, s.out, 3, 1, 1, true, s.device}));
  if (s.in != s.out) conv_shortcut = register_module("conv_shortcut", nn::Conv2d(nn::Conv2dSpec{s.in, s.out, 1, 1, 0, true, s.device}));
}

torch::Tensor ResnetBlock2DImpl::forward(const torch::Tensor& x, const torch::Tensor& time) {
  torch::Tensor h = conv1(torch::silu(norm1(x)));  // [B, out, H, W]
  if (time_emb_proj && time.defined()) h = h + time_emb_proj(torch::silu(time)).unsqueeze(-1).unsqueeze(-1);
  h = conv2(dropout(torch::silu(norm2(h))));
  return (conv_shortcut ? conv_shortcut(x) : x) + h;
}

}  // namespace kuafu::sd
