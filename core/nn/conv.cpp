#include "core/nn/conv.h"

#include "core/util/error.h"

namespace kuafu::nn {

torch::nn::Conv2d make_conv2d(const Conv2dSpec& spec) {
  KUAFU_CHECK(spec.in > 0 && spec.out > 0, "a Conv2d needs positive channels (in ", spec.in, ", out ", spec.out, ")");
  KUAFU_CHECK(spec.kernel > 0 && spec.stride > 0 && spec.padding >= 0, "a Conv2d needs a positive kernel (",
              spec.kernel, ") and stride (", spec.stride, ") and a padding >= 0 (", spec.padding, ")");
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(spec.in, spec.out, spec.kernel)
                             .stride(spec.stride)
                             .padding(spec.padding)
                             .bias(spec.bias));
  // LibTorch initialises on the CPU in float32 (kaiming-uniform, as PyTorch); then to where it runs.
  conv->to(spec.device, spec.dtype);
  return conv;
}

torch::nn::GroupNorm make_group_norm(const GroupNormSpec& spec) {
  KUAFU_CHECK(spec.groups > 0 && spec.channels > 0 && spec.channels % spec.groups == 0, "a GroupNorm's ",
              spec.channels, " channels must divide into its ", spec.groups, " groups");
  torch::nn::GroupNorm norm(torch::nn::GroupNormOptions(spec.groups, spec.channels).eps(spec.eps).affine(spec.affine));
  norm->to(spec.device, spec.dtype);
  return norm;
}

namespace {

int64_t out_channels_of(const ResampleSpec& spec) { return spec.out_channels > 0 ? spec.out_channels : spec.channels; }

void check_input(const torch::Tensor& x, const ResampleSpec& spec, const char* layer) {
  KUAFU_CHECK(x.dim() == 4 && x.size(1) == spec.channels, layer, " takes [B, ", spec.channels, ", H, W] but got ",
              x.sizes());
}

}  // namespace

Upsample2DImpl::Upsample2DImpl(const ResampleSpec& s) : spec(s) {
  conv = register_module("conv", make_conv2d({s.channels, out_channels_of(s), /*kernel=*/3, /*stride=*/1, s.padding,
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
  conv = register_module("conv", make_conv2d({s.channels, out_channels_of(s), /*kernel=*/3, /*stride=*/2, s.padding,
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
