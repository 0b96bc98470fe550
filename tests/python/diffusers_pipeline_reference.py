"""diffusers' StableDiffusionPipeline for tests/apps/stable_diffusion/pipeline_test.cpp (nothing is downloaded).

  diffusers_pipeline_reference.py build OUT
      OUT/pipe: a tiny random pipeline saved with save_pretrained (the CLIP tokenizer folder of
      clip_reference.py, a 2-layer CLIPTextModel of width 12, SD 1.x's UNet shape with cross-attention 12 and
      sample_size 8, a 2-block VAE (16x16 images), SD 1.x's DDIMScheduler config; no safety checker), and
      OUT/reference.safetensors: initial latents [2, 4, 8, 8] and, for prompts PROMPTS at guidance 7.5 over
      10 steps from them, each sampler's final latents and images [2, 3, 16, 16] (<sampler>_latents,
      <sampler>_images) for DDIM, Euler discrete, Heun, DPM-Solver++(2M) and UniPC (each of the last four also with
      Karras sigmas, <sampler>_karras_*), and DDPM and Euler ancestral with their
      noise from a CPU generator seeded 7; and DDIM's with negative prompts NEGATIVE (ddim_negative_*), with
      guidance_rescale 0.7 (ddim_rescale_*), with both (ddim_negative_rescale_*), and with eta 0.5 (its noise from
      the generator seeded 7, ddim_eta_*); DDIM's with two images per prompt drawn from the generator seeded 7
      (ddim_per_prompt_*), and encode_prompt's prompt_embeds and negative_prompt_embeds [4, 77, 12] for them;
      img2img (StableDiffusionImg2ImgPipeline) from OUT/init.png (random 16x16 RGB pixels; init_image [1, 3, 16, 16]
      as PIL reads it, in [0, 1]) at strength 0.6 over 10 steps for each sampler, its draws (the VAE's latent
      sample, then the noise) from the generator seeded 7 (img2img_<sampler>_*), and DDIM's with two images per
      prompt (img2img_ddim_per_prompt_*); DDIM's latents with the pipeline loaded in bf16 and in fp16
      (torch_dtype) from the initial latents rounded to it (bf16_latents, fp16_latents, as float32);
      inpainting (StableDiffusionInpaintPipeline) with OUT/inpaint_pipe (a 9-channel UNet) from OUT/init.png and
      OUT/mask.png (a white rectangle: repainted) at strength 1 (pure noise) for DDIM, Euler ancestral and
      DPM-Solver++(2M), at 0.6 for DDIM, and with two images per prompt (inpaint_<run>_latents, _images), and
      with OUT/pipe's 4-channel UNet (the known part put back after each step) under DDIM and Euler ancestral at
      strength 1 and DPM-Solver++(2M) at 0.6 (inpaint_plain_<run>_*); OUT/kohya_lora.safetensors, a random LoRA in
      kohya's format on the UNet, and DDIM's latents and images with it loaded by load_lora_weights at weight 1
      and 0.5 (kohya_*, kohya_half_*)
  diffusers_pipeline_reference.py check_png PNG REFERENCE KEY
      reads PNG (a grid Kuafu wrote, the images side by side) with PIL and prints, as JSON, the largest
      difference of its pixels from REFERENCE's KEY images [B, 3, H, W] in [0, 1] as 8-bit values
  diffusers_pipeline_reference.py stacked_png GRID TOP BOTTOM
      prints, as JSON, whether GRID's pixels are TOP's above BOTTOM's (three PNGs read with PIL)
"""
import pathlib
import sys

import torch
from diffusers import (AutoencoderKL, DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                       EulerDiscreteScheduler, HeunDiscreteScheduler, StableDiffusionImg2ImgPipeline, StableDiffusionInpaintPipeline,
                       StableDiffusionPipeline, UNet2DConditionModel, UniPCMultistepScheduler)
from safetensors.torch import load_file, save_file
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

from clip_reference import write_tokenizer

PROMPTS = ["a photo of the cat", "the cat!"]
NEGATIVE = ["blurry", "a dog"]
SAMPLERS = {"ddim": DDIMScheduler, "euler": EulerDiscreteScheduler, "dpm": DPMSolverMultistepScheduler, "ddpm": DDPMScheduler,
            "euler_a": EulerAncestralDiscreteScheduler, "heun": HeunDiscreteScheduler, "unipc": UniPCMultistepScheduler}


def randomise(model):
    with torch.no_grad():  # norms and biases away from ones and zeros: a swapped tensor shows
        for key, p in model.named_parameters():
            if "norm" in key or key.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in key and key.endswith("weight") else 0.0))
    return model.eval()


def save_tiny_pipeline(out):
    """Saves the tiny random pipeline in OUT/pipe and returns it as diffusers loads it from there."""
    out = pathlib.Path(out)
    write_tokenizer(out / "tokenizer_files")
    torch.manual_seed(0)
    text_encoder = randomise(CLIPTextModel(CLIPTextConfig(vocab_size=522, hidden_size=12, intermediate_size=24, num_hidden_layers=2,
                                                          num_attention_heads=2, max_position_embeddings=77, eos_token_id=2)))
    unet = randomise(UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, block_out_channels=(16, 32), norm_num_groups=8,
                                          cross_attention_dim=12, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                          up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), layers_per_block=1, attention_head_dim=2))
    vae = randomise(AutoencoderKL(block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4,
                                  down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2))
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1, set_alpha_to_one=False,
                              clip_sample=False)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=CLIPTokenizer.from_pretrained(out / "tokenizer_files"),
                                   unet=unet, scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(out / "pipe")
    # Used from the folder as saved: a scheduler built here would hand its class's defaults to another
    # class through from_config (_use_default_values), which a saved config does not.
    return StableDiffusionPipeline.from_pretrained(out / "pipe")


def build(out):
    out = pathlib.Path(out)
    pipe = save_tiny_pipeline(out)
    saved = pipe.scheduler.config
    latents = torch.randn(2, 4, 8, 8)
    tensors = {"initial_latents": latents}
    for name, kind in {**SAMPLERS, "euler_karras": EulerDiscreteScheduler, "dpm_karras": DPMSolverMultistepScheduler,
                       "heun_karras": HeunDiscreteScheduler, "unipc_karras": UniPCMultistepScheduler}.items():
        pipe.scheduler = kind.from_config(saved, **({"use_karras_sigmas": True} if name.endswith("_karras") else {}))
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            final = pipe(PROMPTS, num_inference_steps=10, guidance_scale=7.5, latents=latents.clone(), generator=generator,
                         output_type="latent").images
            images = pipe(PROMPTS, num_inference_steps=10, guidance_scale=7.5, latents=latents.clone(),
                          generator=torch.Generator().manual_seed(7), output_type="pt").images
        tensors[f"{name}_latents"], tensors[f"{name}_images"] = final, images
    pipe.scheduler = DDIMScheduler.from_config(saved)
    for name, extra in {"ddim_negative": {"negative_prompt": NEGATIVE}, "ddim_rescale": {"guidance_rescale": 0.7},
                        "ddim_negative_rescale": {"negative_prompt": NEGATIVE, "guidance_rescale": 0.7}, "ddim_eta": {"eta": 0.5}}.items():
        with torch.no_grad():
            for output, key in (("latent", "latents"), ("pt", "images")):
                tensors[f"{name}_{key}"] = pipe(PROMPTS, num_inference_steps=10, guidance_scale=7.5, latents=latents.clone(),
                                                output_type=output, generator=torch.Generator().manual_seed(7), **extra).images
    # Two images per prompt from the generator seeded 7 (the initial latents drawn by the pipeline as one
    # [4, 4, 8, 8] batch), and the text embeddings it computes for them.
    with torch.no_grad():
        for output, key in (("latent", "latents"), ("pt", "images")):
            tensors[f"ddim_per_prompt_{key}"] = pipe(PROMPTS, num_inference_steps=10, guidance_scale=7.5, num_images_per_prompt=2,
                                                     output_type=output, generator=torch.Generator().manual_seed(7)).images
        tensors["prompt_embeds"], tensors["negative_prompt_embeds"] = pipe.encode_prompt(PROMPTS, "cpu", 2, True)
    tensors.update(img2img(pipe, saved, out))
    tensors.update(inpaint(pipe, saved, out))
    tensors.update(kohya_lora(out, latents))
    # DDIM's from the same latents (rounded to the dtype) with every component in bf16 and in fp16 (torch_dtype).
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        low = StableDiffusionPipeline.from_pretrained(out / "pipe", torch_dtype=dtype)
        with torch.no_grad():
            tensors[f"{name}_latents"] = low(PROMPTS, num_inference_steps=10, guidance_scale=7.5, latents=latents.to(dtype),
                                             output_type="latent").images.float()
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "reference.safetensors")


def img2img(pipe, saved, out):
    """StableDiffusionImg2ImgPipeline on the same components from OUT/init.png, each sampler at strength 0.6."""
    import numpy as np
    from PIL import Image
    torch.manual_seed(11)
    Image.fromarray((torch.rand(16, 16, 3) * 255).round().to(torch.uint8).numpy()).save(out / "init.png")
    init = Image.open(out / "init.png").convert("RGB")
    tensors = {"init_image": torch.from_numpy(np.asarray(init).copy()).permute(2, 0, 1).unsqueeze(0).float() / 255}
    pipe = StableDiffusionImg2ImgPipeline(**pipe.components)
    runs = {name: (kind, 1) for name, kind in SAMPLERS.items()}
    runs["ddim_per_prompt"] = (DDIMScheduler, 2)
    for name, (kind, per_prompt) in runs.items():
        pipe.scheduler = kind.from_config(saved)
        with torch.no_grad():
            for output, key in (("latent", "latents"), ("pt", "images")):
                tensors[f"img2img_{name}_{key}"] = pipe(PROMPTS, image=init, strength=0.6, num_inference_steps=10, guidance_scale=7.5,
                                                        num_images_per_prompt=per_prompt, output_type=output,
                                                        generator=torch.Generator().manual_seed(7)).images
    return tensors


def inpaint(pipe, saved, out):
    """StableDiffusionInpaintPipeline: OUT/inpaint_pipe, the same components but a 9-channel UNet (latents, mask,
    the masked image's latents), from OUT/init.png and OUT/mask.png (white: repainted)."""
    import numpy as np
    from PIL import Image
    torch.manual_seed(12)
    unet = randomise(UNet2DConditionModel(sample_size=8, in_channels=9, out_channels=4, block_out_channels=(16, 32), norm_num_groups=8,
                                          cross_attention_dim=12, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                          up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), layers_per_block=1, attention_head_dim=2))
    components4 = pipe.components
    components = dict(pipe.components, unet=unet)
    StableDiffusionInpaintPipeline(**components).save_pretrained(out / "inpaint_pipe")
    pipe = StableDiffusionInpaintPipeline.from_pretrained(out / "inpaint_pipe")
    mask = np.zeros((16, 16), dtype=np.uint8)
    mask[3:11, 5:14] = 255
    Image.fromarray(mask).save(out / "mask.png")
    init, mask = Image.open(out / "init.png").convert("RGB"), Image.open(out / "mask.png").convert("L")
    tensors = {}
    plain = StableDiffusionInpaintPipeline(**components4)
    runs = {"ddim": (DDIMScheduler, 1.0, 1), "euler_a": (EulerAncestralDiscreteScheduler, 1.0, 1), "dpm": (DPMSolverMultistepScheduler, 1.0, 1),
            "ddim_strength": (DDIMScheduler, 0.6, 1), "ddim_per_prompt": (DDIMScheduler, 1.0, 2),
            # The legacy way with the 4-channel UNet of OUT/pipe: the known part put back after each step.
            "plain_ddim": (DDIMScheduler, 1.0, 1), "plain_euler_a": (EulerAncestralDiscreteScheduler, 1.0, 1),
            "plain_dpm_strength": (DPMSolverMultistepScheduler, 0.6, 1)}
    inpainting = pipe
    for name, (kind, strength, per_prompt) in runs.items():
        pipe = plain if name.startswith("plain_") else inpainting
        pipe.scheduler = kind.from_config(saved)
        with torch.no_grad():
            for output, key in (("latent", "latents"), ("pt", "images")):
                tensors[f"inpaint_{name}_{key}"] = pipe(PROMPTS, image=init, mask_image=mask, strength=strength, num_inference_steps=10,
                                                        guidance_scale=7.5, num_images_per_prompt=per_prompt, output_type=output,
                                                        generator=torch.Generator().manual_seed(7)).images
    return tensors


def kohya_lora(out, latents):
    """OUT/kohya_lora.safetensors: random kohya-format LoRA (rank 2, alpha 3) on seven of the UNet's layers
    (attention projections, proj_in, the feed-forward's, a ResNet's 3x3 convolution as LoCon), and DDIM's latents
    and images with it loaded by load_lora_weights at weight 1 and 0.5 (kohya_*, kohya_half_*)."""
    pipe = StableDiffusionPipeline.from_pretrained(out / "pipe")
    modules = dict(pipe.unet.named_modules())
    torch.manual_seed(13)
    lora = {}
    for path in ["down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q", "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k",
                 "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_out.0", "down_blocks.0.attentions.0.proj_in",
                 "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.0.proj", "up_blocks.1.attentions.0.transformer_blocks.0.attn2.to_v",
                 "down_blocks.0.resnets.0.conv1"]:
        w, key = modules[path].weight, "lora_unet_" + path.replace(".", "_")
        lora[key + ".lora_down.weight"] = torch.randn(2, *w.shape[1:]) * 0.3
        lora[key + ".lora_up.weight"] = torch.randn(w.shape[0], 2, *([1, 1] if w.dim() == 4 else [])) * 0.3
        lora[key + ".alpha"] = torch.tensor(3.0)
    save_file(lora, out / "kohya_lora.safetensors")
    pipe.load_lora_weights(out / "kohya_lora.safetensors", adapter_name="kohya")
    tensors = {}
    for name, weight in (("kohya", 1.0), ("kohya_half", 0.5)):
        pipe.set_adapters(["kohya"], adapter_weights=[weight])
        with torch.no_grad():
            for output, key in (("latent", "latents"), ("pt", "images")):
                tensors[f"{name}_{key}"] = pipe(PROMPTS, num_inference_steps=10, guidance_scale=7.5, latents=latents.clone(),
                                                output_type=output).images
    return tensors


def check_png(png, reference, key):
    import json
    import numpy as np
    from PIL import Image
    grid = np.asarray(Image.open(png).convert("RGB")).astype(np.int64)  # [H, B·W, 3]
    images = load_file(reference)[key]
    expected = torch.cat(list(images), dim=2).permute(1, 2, 0).mul(255).round().clamp(0, 255).to(torch.int64).numpy()
    print(json.dumps({"max_difference": int(np.abs(grid - expected).max()), "size": list(grid.shape)}))


def stacked_png(grid, top, bottom):
    import json
    import numpy as np
    from PIL import Image
    read = lambda path: np.asarray(Image.open(path).convert("RGB"))  # [H, W, 3]
    expected = np.concatenate([read(top), read(bottom)], axis=0)
    found = read(grid)
    print(json.dumps({"size": list(found.shape), "stacked": found.shape == expected.shape and bool((found == expected).all())}))


if __name__ == "__main__":
    commands = {"build": build, "check_png": check_png, "stacked_png": stacked_png}
    if len(sys.argv) < 3 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
