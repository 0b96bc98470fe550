#include "core/nn/conv.h"

#include "core/util/error.h"

namespace kuafu::nn {

Conv2dImpl::Conv2dImpl(const Conv2dSpec& s) : spec(s) {
  KUAFU_CHECK(s.in > 0 && s.out > 0, "a Conv2d needs positive channels (in ", s.in, ", out ", s.out, ")");
  KUAFU_CHECK(s.kernel > 0 && s.stride > 0 && s.padding >= 0, "a Conv2d needs a positive kernel (", s.kernel,
              ") and stride (", s.stride, ") and a padding >= 0 (", s.padding, ")");
  const auto on = torch::TensorOptions().device(s.device).dtype(s.dtype);
  weight = register_parameter("weight", torch::zeros({s.out, s.in, s.kernel, s.kernel}, on));
  if (s.bias) bias = register_parameter("bias", torch::zeros({s.out}, on));
}

torch::Tensor Conv2dImpl::forward(const torch::Tensor& x) {
  return torch::conv2d(x, weight, bias, {spec.stride, spec.stride}, {spec.padding, spec.padding});
}

GroupNormImpl::GroupNormImpl(const GroupNormSpec& s) : spec(s) {
  KUAFU_CHECK(s.groups > 0 && s.channels > 0 && s.channels % s.groups == 0, "a GroupNorm's ", s.channels,
              " channels must divide into its ", s.groups, " groups");
  if (!s.affine) return;
  const auto on = torch::TensorOptions().device(s.device).dtype(s.dtype);
  weight = register_parameter("weight", torch::ones({s.channels}, on));
  bias = register_parameter("bias", torch::zeros({s.channels}, on));
}

torch::Tensor GroupNormImpl::forward(const torch::Tensor& x) {
  return torch::group_norm(x, spec.groups, weight, bias, spec.eps);
}

namespace {

int64_t out_channels_of(const ResampleSpec& spec) { return spec.out_channels > 0 ? spec.out_channels : spec.channels; }

void check_input(const torch::Tensor& x, const ResampleSpec& spec, const char* layer) {
  KUAFU_CHECK(x.dim() == 4 && x.size(1) == spec.channels, layer, " takes [B, ", spec.channels, ", H, W] but got ",
              x.sizes());
}

}  // namespace

Upsample2DImpl::Upsample2DImpl(const ResampleSpec& s) : spec(s) {
  conv = register_module("conv", Conv2d(Conv2dSpec{s.channels, out_channels_of(s), /*kernel=*/3, /*stride=*/1, s.padding,
                                              /*bias=*/true, s.device, s.dtype}));
}

torch::Tensor Upsample2DImpl::forward(const torch::Tensor& x, const std::vector<int64_t>& output_size) {
  check_input(x, spec, "Upsample2D");
  namespace F = torch::nn::functional;
  auto options = F::InterpolateFuncOptions().mode(torch::kNearest);
  if (output_size.empty()) {
    options.scale_factor(std::vector<double>{2.0, 2.0});
  } else {
    KUAFU_CHECK(output_size.size() == 2 && output_size[0] > 0 && output_size[1] > 0,
                "Upsample2D's output size is {H, W}, got ", output_size.size(), " numbers");
    options.size(output_size);
  }
  const torch::Tensor up = F::interpolate(x, options);  // [B, C, 2H, 2W] or [B, C, H', W']
  return conv(up);                                       // [B, C_out, same]
}

Downsample2DImpl::Downsample2DImpl(const ResampleSpec& s) : spec(s) {
  KUAFU_CHECK(s.padding == 0 || s.padding == 1, "Downsample2D's padding is 1 (UNet) or 0 (VAE), not ", s.padding);
  conv = register_module("conv", Conv2d(Conv2dSpec{s.channels, out_channels_of(s), /*kernel=*/3, /*stride=*/2, s.padding,
                                              /*bias=*/true, s.device, s.dtype}));
}

torch::Tensor Downsample2DImpl::forward(const torch::Tensor& x) {
  check_input(x, spec, "Downsample2D");
  if (spec.padding == 0) {
    // As diffusers: one zero row and column at the bottom and right only, so [B, C, H, W] ->
    // [B, C, H + 1, W + 1] and an even H halves exactly.
    return conv(torch::constant_pad_nd(x, {0, 1, 0, 1}, 0));  // [B, C_out, H/2, W/2]
  }
  return conv(x);  // [B, C_out, ceil(H/2), ceil(W/2)]
}

}  // namespace kuafu::nn
