"""diffusers' AutoencoderKL for tests/apps/stable_diffusion/vae_test.cpp (nothing is downloaded).

  diffusers_vae_reference.py build OUT
      OUT/vae: a tiny random AutoencoderKL (two blocks of 8 and 16 channels, 4 groups, the mid block's
      attention), saved with save_pretrained; OUT/vae_old_names: the same weights under the older attention
      names (query, key, value, proj_attn), which diffusers still reads;
      OUT/reference.safetensors: images [2, 3, 16, 16], the posterior's mean and logvar, and the decoding
      of the mean (decoded); latents [1, 4, 21, 14] (tiled_latents) and their tiled decoding
      (tiled_decoded: enable_tiling with the config's sample_size 16, tiles of 8 latents, the last row
      and column short)
  diffusers_vae_reference.py check DIR EXPECTED
      loads DIR (a folder Kuafu wrote) with AutoencoderKL.from_pretrained and prints, as JSON, the largest
      difference of its mean, logvar and decoding of EXPECTED's images from EXPECTED's
"""
import json
import pathlib
import shutil
import sys

import torch
from diffusers import AutoencoderKL
from safetensors.torch import load_file, save_file


def outputs(vae, images):
    with torch.no_grad():
        posterior = vae.encode(images).latent_dist
        return posterior.mean, posterior.logvar, vae.decode(posterior.mean).sample


def build(out):
    out = pathlib.Path(out)
    torch.manual_seed(0)
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16), layers_per_block=1,
                        norm_num_groups=4, sample_size=16, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2).eval()
    with torch.no_grad():  # GroupNorms and biases away from ones and zeros: a swapped tensor shows
        for name, p in vae.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name and name.endswith("weight") else 0.0))
    vae.save_pretrained(out / "vae")
    old = out / "vae_old_names"
    shutil.copytree(out / "vae", old)
    weights = load_file(old / "diffusion_pytorch_model.safetensors")
    renamed = {}
    for name, t in weights.items():
        for new, previous in (("to_q", "query"), ("to_k", "key"), ("to_v", "value"), ("to_out.0", "proj_attn")):
            if f".attentions.0.{new}." in name:
                name = name.replace(f".{new}.", f".{previous}.")
        renamed[name] = t.contiguous()
    save_file(renamed, old / "diffusion_pytorch_model.safetensors")
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    mean, logvar, decoded = outputs(vae, images)
    tiled_latents = torch.randn(1, 4, 21, 14)
    vae.enable_tiling()
    with torch.no_grad():
        tiled_decoded = vae.decode(tiled_latents).sample
    tensors = {"images": images, "mean": mean, "logvar": logvar, "decoded": decoded, "tiled_latents": tiled_latents,
               "tiled_decoded": tiled_decoded}
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "reference.safetensors")


def check(folder, expected):
    e = load_file(expected)
    got = outputs(AutoencoderKL.from_pretrained(folder).eval(), e["images"])
    print(json.dumps({"max_difference": max((a - e[k]).abs().max().item() for a, k in zip(got, ("mean", "logvar", "decoded")))}))


if __name__ == "__main__":
    commands = {"build": build, "check": check}
    if len(sys.argv) < 3 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
