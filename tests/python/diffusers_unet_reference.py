"""diffusers' UNet2DConditionModel for tests/apps/stable_diffusion/unet_test.cpp (nothing is downloaded).

  diffusers_unet_reference.py build OUT
      OUT/sd1, OUT/sd2: tiny random UNets of SD 1.x's shape (convolution projections, one head count,
      a DownBlock2D / UpBlock2D pair) and SD 2.x's (linear projections, per-block heads, upcast attention,
      two layers per block), saved with save_pretrained; OUT/reference.safetensors: latents [2, 4, 8, 8],
      timesteps, text [2, 5, 12] and each UNet's prediction (<name>_out), and an odd size (latents_odd
      [1, 4, 9, 9], halved to 5 and brought back to 9) through sd1 (sd1_out_odd);
      OUT/sdxl: SDXL's shape (addition_embed_type "text_time": the pooled text text_embeds [2, 10] and the
      time ids time_ids [2, 6]; a first block without attention, transformer_layers_per_block (1, 2, 3),
      three widths, linear projections) on non-square latents sdxl_latents [2, 4, 8, 12] (sdxl_out)
  diffusers_unet_reference.py check DIR EXPECTED
      loads DIR (a folder Kuafu wrote) with UNet2DConditionModel.from_pretrained and prints, as JSON, the
      largest difference of its prediction on EXPECTED's inputs (text_embeds and time_ids where it has
      them) from EXPECTED's
"""
import json
import pathlib
import sys

import torch
from diffusers import UNet2DConditionModel
from safetensors.torch import load_file, save_file

SHAPES = {
    "sd1": dict(down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                layers_per_block=1, attention_head_dim=2),
    "sd2": dict(down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), layers_per_block=2, attention_head_dim=(2, 4),
                use_linear_projection=True, upcast_attention=True),
}


SDXL = dict(down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(16, 24, 32),
            layers_per_block=2, attention_head_dim=(2, 3, 4), transformer_layers_per_block=(1, 2, 3), use_linear_projection=True,
            addition_embed_type="text_time", addition_time_embed_dim=4, projection_class_embeddings_input_dim=10 + 6 * 4)


def predict(unet, latents, timesteps, text, added=None):
    with torch.no_grad():
        return unet(latents, timesteps, encoder_hidden_states=text, added_cond_kwargs=added).sample


def randomise(unet):
    with torch.no_grad():  # norms and biases away from ones and zeros: a swapped tensor shows
        for key, p in unet.named_parameters():
            if "norm" in key or key.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in key and key.endswith("weight") else 0.0))


def build(out):
    out = pathlib.Path(out)
    torch.manual_seed(0)
    latents, text = torch.randn(2, 4, 8, 8), torch.randn(2, 5, 12)
    timesteps = torch.tensor([10.0, 981.0])
    latents_odd = torch.randn(1, 4, 9, 9)
    tensors = {"latents": latents, "timesteps": timesteps, "text": text, "latents_odd": latents_odd}
    for seed, (name, shape) in enumerate(SHAPES.items()):
        torch.manual_seed(seed + 1)
        unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, block_out_channels=(16, 32), norm_num_groups=8,
                                    cross_attention_dim=12, **shape).eval()
        randomise(unet)
        unet.save_pretrained(out / name)
        tensors[f"{name}_out"] = predict(unet, latents, timesteps, text)
        if name == "sd1":
            tensors["sd1_out_odd"] = predict(unet, latents_odd, timesteps[:1], text[:1])
    torch.manual_seed(3)
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, norm_num_groups=8, cross_attention_dim=12, **SDXL).eval()
    randomise(unet)
    unet.save_pretrained(out / "sdxl")
    tensors["sdxl_latents"] = torch.randn(2, 4, 8, 12)
    tensors["text_embeds"] = torch.randn(2, 10)
    tensors["time_ids"] = torch.tensor([[64.0, 96.0, 0.0, 0.0, 64.0, 96.0], [48.0, 80.0, 4.0, 8.0, 64.0, 96.0]])
    added = {"text_embeds": tensors["text_embeds"], "time_ids": tensors["time_ids"]}
    tensors["sdxl_out"] = predict(unet, tensors["sdxl_latents"], timesteps, text, added)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "reference.safetensors")


def check(folder, expected):
    e = load_file(expected)
    added = {"text_embeds": e["text_embeds"], "time_ids": e["time_ids"]} if "time_ids" in e else None
    got = predict(UNet2DConditionModel.from_pretrained(folder).eval(), e["latents"], e["timesteps"], e["text"], added)
    print(json.dumps({"max_difference": (got - e["out"]).abs().max().item()}))


if __name__ == "__main__":
    commands = {"build": build, "check": check}
    if len(sys.argv) < 3 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
