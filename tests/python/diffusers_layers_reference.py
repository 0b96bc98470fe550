"""Reference outputs of diffusers' image and attention layers for tests/core/nn/nn_layers_test.cpp.

  diffusers_layers_reference.py build OUT   writes OUT/reference.safetensors: for every case below, in
                                            float64, the layer's parameters, inputs, a random upstream
                                            gradient, its output and the gradients of the inputs and of
                                            every parameter, named

    CASE.param.NAME  CASE.x  CASE.context  CASE.key_mask  CASE.upstream
    CASE.y  CASE.grad.x  CASE.grad.context  CASE.grad.NAME

  NAME is diffusers' parameter name (its state dict's), so a checkpoint maps one to one. Nothing is downloaded.
"""
import pathlib
import sys

import torch
from diffusers.models.attention_processor import Attention
from diffusers.models.downsampling import Downsample2D
from diffusers.models.upsampling import Upsample2D


def named_parameters(module):
    # Downsample2D registers its convolution twice, as "Conv2d_0" and "conv"; checkpoints and Kuafu use "conv".
    names = dict(module.named_parameters(remove_duplicate=False))
    return {n: p for n, p in names.items() if not n.startswith("Conv2d_0.")}


def randomize(module, generator):
    # Random values everywhere (GroupNorm's ones and zeros too) so a swapped or skipped tensor shows.
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.5)


def run_case(out, case, module, inputs, call, generator):
    """inputs: name -> tensor (x, context: differentiable; key_mask: not); call(module, **inputs) -> y."""
    module = module.double().eval()
    randomize(module, generator)
    params = named_parameters(module)
    for name, p in params.items():
        out[f"{case}.param.{name}"] = p.detach().clone()
    leaves = {}
    for name, t in inputs.items():
        out[f"{case}.{name}"] = t.clone()
        leaves[name] = t.clone().requires_grad_(t.is_floating_point())
    y = call(module, **leaves)
    upstream = torch.randn(y.shape, generator=generator, dtype=torch.float64)
    (y * upstream).sum().backward()
    out[f"{case}.upstream"] = upstream
    out[f"{case}.y"] = y.detach()
    for name, t in leaves.items():
        if t.requires_grad:
            out[f"{case}.grad.{name}"] = t.grad
    for name, p in params.items():
        out[f"{case}.grad.{name}"] = p.grad


def build(out_dir):
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    out = {}
    conv = lambda m, x: m(x)
    # Convolutions: 3x3 stride 1 and 2 with padding 1 (odd sizes, so stride 2 rounds up), 1x1 without bias.
    run_case(out, "conv_s1", torch.nn.Conv2d(3, 5, 3, stride=1, padding=1), {"x": randn(2, 3, 7, 6)}, conv, g)
    run_case(out, "conv_s2", torch.nn.Conv2d(3, 5, 3, stride=2, padding=1), {"x": randn(2, 3, 7, 6)}, conv, g)
    run_case(out, "conv_1x1", torch.nn.Conv2d(4, 6, 1, bias=False), {"x": randn(2, 4, 3, 5)}, conv, g)
    # diffusers' resampling layers with a convolution, as the UNet (padding 1) and the VAE encoder (0) use them.
    run_case(out, "upsample", Upsample2D(4, use_conv=True, out_channels=6), {"x": randn(2, 4, 3, 5)}, conv, g)
    run_case(out, "upsample_size", Upsample2D(4, use_conv=True), {"x": randn(2, 4, 3, 5)},
             lambda m, x: m(x, output_size=(7, 10)), g)
    run_case(out, "downsample", Downsample2D(4, use_conv=True, out_channels=6, padding=1),
             {"x": randn(2, 4, 7, 6)}, conv, g)
    run_case(out, "downsample_pad0", Downsample2D(4, use_conv=True, padding=0), {"x": randn(2, 4, 8, 6)}, conv, g)
    # GroupNorm as diffusers configures it: eps 1e-6 with affine parameters, and eps 1e-5 without.
    run_case(out, "group_norm", torch.nn.GroupNorm(4, 8, eps=1e-6), {"x": randn(2, 8, 3, 5)}, conv, g)
    run_case(out, "group_norm_plain", torch.nn.GroupNorm(2, 6, eps=1e-5, affine=False), {"x": randn(3, 6, 4, 2)},
             conv, g)

    # Attention: inner width heads x dim_head (20) differs from query_dim (12) and the context's width (10).
    def cross():
        return Attention(query_dim=12, cross_attention_dim=10, heads=4, dim_head=5)

    attend = lambda m, x, context: m(x, encoder_hidden_states=context)
    run_case(out, "attention_cross", cross(), {"x": randn(2, 6, 12), "context": randn(2, 7, 10)}, attend, g)
    run_case(out, "attention_self", Attention(query_dim=12, heads=2, dim_head=6, bias=True), {"x": randn(2, 6, 12)},
             lambda m, x: m(x), g)
    # A key mask as UNet2DConditionModel passes one (encoder_attention_mask): (1 - mask) * -10000 as
    # [B, 1, M], which prepare_attention_mask repeats over the heads. Row 0 has its last 3 keys masked,
    # row 1 its first 2.
    key_mask = torch.ones(2, 7, dtype=torch.bool)
    key_mask[0, 4:] = False
    key_mask[1, :2] = False

    def masked(m, x, context, key_mask):
        bias = (1 - key_mask.to(torch.float64)) * -10000.0
        return m(x, encoder_hidden_states=context, attention_mask=bias.unsqueeze(1))

    run_case(out, "attention_mask", cross(), {"x": randn(2, 6, 12), "context": randn(2, 7, 10), "key_mask": key_mask},
             masked, g)

    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in out.items()}, str(out_dir / "reference.safetensors"))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "build":
        build(sys.argv[2])
    else:
        sys.exit("usage: diffusers_layers_reference.py build OUT")
