"""diffusers' StableDiffusionXLPipeline for tests/apps/stable_diffusion/sdxl_pipeline_test.cpp (nothing is downloaded).

  diffusers_sdxl_reference.py build OUT
      OUT/pipe: a tiny random SDXL pipeline saved with save_pretrained: two tokenizers (clip_reference.py's
      folder, the second padding with "!" as SDXL's does), a 2-layer CLIPTextModel of width 16 (eos_token_id 2:
      pooled at the highest id) and a 3-layer CLIPTextModelWithProjection of width 24 (projection_dim 20,
      pooled at the first <|endoftext|>), an SDXL-shaped UNet (a first block without attention, 1 and 2
      transformer blocks, cross-attention 40 = 16 + 24, the text_time added conditioning), a 2-block VAE with
      SDXL's scaling factor, SDXL's EulerDiscreteScheduler config, force_zeros_for_empty_prompt; and
      OUT/reference.safetensors: initial latents [2, 4, 8, 12] (16 x 24 pixels, not square) and, for PROMPTS
      at guidance 5 over 10 steps from them: the folder's Euler sampler's final latents and images
      (euler_latents, euler_images) with no negative prompt (zero embeddings), encode_prompt's prompt_embeds
      [2, 77, 40], pooled_prompt_embeds [2, 20], and the negative ones; with NEGATIVE as negative prompts
      (negative_latents); with guidance_rescale 0.7 (rescale_latents); under DDIM (ddim_latents, and the same run
      in float64: ddim_float64_latents); Euler ancestral with its noise from a CPU generator seeded 7
      (euler_a_latents); Heun, UniPC, DPM-Solver++(2M) with Karras sigmas and Euler with them (heun_latents,
      unipc_latents, dpm_karras_latents, euler_karras_latents); img2img (StableDiffusionXLImg2ImgPipeline) of init_image [1, 3, 16, 24] in [0, 1] at strength
      0.6 under Euler, its draws from the generator seeded 7 (img2img_latents); inpainting
      (StableDiffusionXLInpaintPipeline, the plain UNet) of it with mask_image (a rectangle repainted) at strength 1 and
      0.6 (inpaint_latents, inpaint_strength_latents), and with a 9-channel inpainting UNet saved as OUT/inpaint_pipe
      (inpaint_unet_latents, inpaint_unet_strength_latents); train_text_to_image_sdxl.py's objective on two images (train_*: the pixels, the
      VAE posterior's and the diffusion noise, timesteps, latents, text, pooled text, the loss and the gradients
      of TRAINING_GRADIENTS, train_grad.<name>); PEFT's LoRA on the UNet and both encoders as diffusers converts it
      to kohya's format (OUT/peft_kohya.safetensors) and the Euler latents with it active (peft_kohya_latents); a
      kohya LoRA named as sd-scripts names SDXL's layers (OUT/sgm_kohya.safetensors) and the Euler latents with it
      loaded (sgm_kohya_latents)
  diffusers_sdxl_reference.py embedding_sample PIPE EMBEDDING TOKEN LATENTS OUT
      loads the SDXL pipeline PIPE and the textual-inversion file EMBEDDING's clip_l and clip_g rows as TOKEN into the
      first and second text encoder (load_textual_inversion, as diffusers documents SDXL embeddings), and writes to
      OUT ("latents") what it samples at 16 x 24 px for "a photo of TOKEN" and "TOKEN on a mat" from LATENTS'
      "latents" (the folder's Euler, 4 steps, guidance 3)
  diffusers_sdxl_reference.py lora_sample PIPE ADAPTER MERGED LATENTS OUT
      Kuafu's LoRA adapter folder ADAPTER (UNet and both text encoders) loaded into PIPE by load_lora_weights, and the
      merged pipeline folder MERGED, each sampling "a red square, number 1" and "a blue square" at 16 x 24 px from
      LATENTS' "latents" (Euler, 4 steps, guidance 3): OUT's "diffusers" and "merged"
"""
import pathlib
import sys

import torch
import torch.nn.functional as F
from diffusers import (AutoencoderKL, DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                       EulerDiscreteScheduler, HeunDiscreteScheduler, StableDiffusionXLImg2ImgPipeline, StableDiffusionXLInpaintPipeline,
                       StableDiffusionXLPipeline, UNet2DConditionModel, UniPCMultistepScheduler)
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

from clip_reference import write_tokenizer
from diffusers_pipeline_reference import randomise
from diffusers_training_reference import training_draws

PROMPTS = ["a photo of the cat", "the cat!"]
NEGATIVE = ["blurry", "a dog"]
CAPTIONS = ["a photo of the cat", ""]
TRAINING_GRADIENTS = ["conv_in.weight", "add_embedding.linear_1.weight", "add_embedding.linear_2.bias",
                      "down_blocks.1.attentions.0.transformer_blocks.1.attn2.to_k.weight", "mid_block.resnets.0.time_emb_proj.weight",
                      "up_blocks.0.attentions.1.transformer_blocks.0.ff.net.2.weight", "conv_out.bias"]


def clip(kind, width, layers, eos, **extra):
    return randomise(kind(CLIPTextConfig(vocab_size=522, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                                         num_attention_heads=2, max_position_embeddings=77, eos_token_id=eos, bos_token_id=520,
                                         pad_token_id=521, hidden_act="gelu", **extra)))


def save_tiny_pipeline(out):
    """Saves the tiny random SDXL pipeline in OUT/pipe and returns it as diffusers loads it from there."""
    write_tokenizer(out / "tokenizer_files")
    write_tokenizer(out / "tokenizer_2_files", pad="!")
    torch.manual_seed(0)
    text_encoder = clip(CLIPTextModel, 16, 2, 2)
    text_encoder_2 = clip(CLIPTextModelWithProjection, 24, 3, 521, projection_dim=20)
    unet = randomise(UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(16, 32), norm_num_groups=8, cross_attention_dim=40,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        layers_per_block=1, attention_head_dim=(2, 4), transformer_layers_per_block=(1, 2), use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=4, projection_class_embeddings_input_dim=20 + 6 * 4))
    vae = randomise(AutoencoderKL(block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, scaling_factor=0.13025,
                                  down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2))
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1,
                                       timestep_spacing="leading")
    pipe = StableDiffusionXLPipeline(vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2,
                                     tokenizer=CLIPTokenizer.from_pretrained(out / "tokenizer_files"),
                                     tokenizer_2=CLIPTokenizer.from_pretrained(out / "tokenizer_2_files"), unet=unet,
                                     scheduler=scheduler, force_zeros_for_empty_prompt=True, add_watermarker=False)
    pipe.save_pretrained(out / "pipe")
    return StableDiffusionXLPipeline.from_pretrained(out / "pipe", add_watermarker=False)


def build(out):
    out = pathlib.Path(out)
    pipe = save_tiny_pipeline(out)
    torch.manual_seed(1)
    latents = torch.randn(2, 4, 8, 12)
    tensors = {"initial_latents": latents}

    def run(name, output_type="latent", generator=None, **kwargs):
        result = pipe(PROMPTS, height=16, width=24, num_inference_steps=10, guidance_scale=5.0, latents=latents.clone(),
                      output_type=output_type, generator=generator, **kwargs)
        if output_type == "latent":
            tensors[f"{name}_latents"] = result.images
        else:
            tensors[f"{name}_images"] = result.images

    run("euler")
    run("euler", output_type="pt")
    prompt, negative, pooled, negative_pooled = pipe.encode_prompt(PROMPTS, device="cpu", num_images_per_prompt=1,
                                                                   do_classifier_free_guidance=True)
    tensors.update(prompt_embeds=prompt, negative_prompt_embeds=negative, pooled_prompt_embeds=pooled,
                   negative_pooled_prompt_embeds=negative_pooled)
    run("negative", negative_prompt=NEGATIVE)
    run("rescale", guidance_rescale=0.7)
    euler_config = pipe.scheduler.config
    pipe.scheduler = DDIMScheduler.from_config(euler_config)
    run("ddim")
    # DDIM from Euler's config clips x̂₀ to [-1, 1] (its class default): this tiny model's trajectory then moves
    # by float32's rounding alone by ~3e-4; the float64 run measures that.
    pipe.to(torch.float64)
    tensors["ddim_float64_latents"] = pipe(PROMPTS, height=16, width=24, num_inference_steps=10, guidance_scale=5.0,
                                           latents=latents.double(), output_type="latent").images.float()
    pipe.to(torch.float32)
    pipe.scheduler = EulerAncestralDiscreteScheduler.from_config(euler_config)
    run("euler_a", generator=torch.Generator().manual_seed(7))
    for name, kind in (("heun", HeunDiscreteScheduler), ("unipc", UniPCMultistepScheduler), ("dpm_karras", DPMSolverMultistepScheduler),
                       ("euler_karras", EulerDiscreteScheduler)):
        pipe.scheduler = kind.from_config(euler_config, **({"use_karras_sigmas": True} if name.endswith("_karras") else {}))
        run(name)
    pipe.scheduler = EulerDiscreteScheduler.from_config(euler_config)
    # img2img (StableDiffusionXLImg2ImgPipeline, no aesthetic score): the image's latents drawn, then the noise.
    torch.manual_seed(3)
    tensors["init_image"] = torch.rand(1, 3, 16, 24)
    img2img = StableDiffusionXLImg2ImgPipeline(**pipe.components)
    tensors["img2img_latents"] = img2img(PROMPTS, image=tensors["init_image"], strength=0.6, num_inference_steps=10,
                                         guidance_scale=5.0, generator=torch.Generator().manual_seed(7), output_type="latent").images
    # Inpainting (StableDiffusionXLInpaintPipeline) with the plain 4-channel UNet: the known part put back after each step.
    mask = torch.zeros(1, 1, 16, 24)
    mask[:, :, 4:12, 6:18] = 1.0
    tensors["mask_image"] = mask
    inpaint = StableDiffusionXLInpaintPipeline(**pipe.components)
    for name, strength in (("inpaint", 1.0), ("inpaint_strength", 0.6)):
        tensors[f"{name}_latents"] = inpaint(PROMPTS, image=tensors["init_image"], mask_image=mask, strength=strength, height=16, width=24,
                                             num_inference_steps=10, guidance_scale=5.0, generator=torch.Generator().manual_seed(7),
                                             output_type="latent").images
    tensors.update(inpaint_unet(pipe, out, mask, tensors["init_image"]))
    tensors.update(training_step(pipe, out))
    tensors["sgm_kohya_latents"] = sgm_kohya(out, latents)
    tensors["peft_kohya_latents"] = kohya_from_peft(pipe, out, latents)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "reference.safetensors")


# sd-scripts' names of SDXL's UNet layers (the original model's blocks) for some of the tiny UNet's layers (layers_per_block
# 1): LoCon convolutions in ResNets, the down- and upsamplers, the embeddings, conv_in and conv_out, and attention's.
SGM_LAYERS = {
    "input_blocks_0_0": "conv_in", "time_embed_0": "time_embedding.linear_1", "label_emb_0_0": "add_embedding.linear_1",
    "input_blocks_1_0_in_layers_2": "down_blocks.0.resnets.0.conv1", "input_blocks_1_0_emb_layers_1": "down_blocks.0.resnets.0.time_emb_proj",
    "input_blocks_2_0_op": "down_blocks.0.downsamplers.0.conv", "input_blocks_3_0_skip_connection": "down_blocks.1.resnets.0.conv_shortcut",
    "input_blocks_3_1_proj_in": "down_blocks.1.attentions.0.proj_in",
    "input_blocks_3_1_transformer_blocks_1_attn2_to_k": "down_blocks.1.attentions.0.transformer_blocks.1.attn2.to_k",
    "middle_block_1_transformer_blocks_0_attn1_to_q": "mid_block.attentions.0.transformer_blocks.0.attn1.to_q",
    "middle_block_2_out_layers_3": "mid_block.resnets.1.conv2",
    "output_blocks_1_1_transformer_blocks_0_ff_net_0_proj": "up_blocks.0.attentions.1.transformer_blocks.0.ff.net.0.proj",
    "output_blocks_1_2_conv": "up_blocks.0.upsamplers.0.conv", "output_blocks_3_0_skip_connection": "up_blocks.1.resnets.1.conv_shortcut",
    "out_2": "conv_out"}


def sgm_kohya(out, latents):
    """A random kohya LoRA (rank 2, alpha 3) named as sd-scripts names SDXL's layers (SGM_LAYERS; OUT/sgm_kohya.safetensors)
    and the Euler latents with it loaded by load_lora_weights, which maps those names to diffusers' itself."""
    pipe = StableDiffusionXLPipeline.from_pretrained(out / "pipe", add_watermarker=False)
    modules = dict(pipe.unet.named_modules())
    torch.manual_seed(6)
    lora = {}
    for name, path in SGM_LAYERS.items():
        weight = modules[path].weight  # [out, in] or [out, in, kh, kw]
        down_shape = (2, *weight.shape[1:])
        up_shape = (weight.shape[0], 2) + (1, 1) * (weight.dim() == 4)
        lora[f"lora_unet_{name}.lora_down.weight"] = torch.randn(down_shape) * 0.1
        lora[f"lora_unet_{name}.lora_up.weight"] = torch.randn(up_shape) * 0.1
        lora[f"lora_unet_{name}.alpha"] = torch.tensor(3.0)
    save_file(lora, out / "sgm_kohya.safetensors")
    pipe.load_lora_weights(out / "sgm_kohya.safetensors")
    adapted = [n for n, m in pipe.unet.named_modules() if getattr(m, "lora_A", None)]
    assert sorted(adapted) == sorted(SGM_LAYERS.values()), f"diffusers adapted {adapted}"
    return pipe(PROMPTS, height=16, width=24, num_inference_steps=10, guidance_scale=5.0, latents=latents.clone(),
                output_type="latent").images


def kohya_from_peft(pipe, out, latents):
    """PEFT's LoRA (r 2, A and B both random) on the UNet's attention projections and both text encoders', written
    as kohya's file by diffusers' convert_state_dict_to_kohya (OUT/peft_kohya.safetensors: lora_unet_*, lora_te1_*,
    lora_te2_*); returns the Euler latents with the adapters active. lora_alpha = r because the converter writes
    alpha = r whatever lora_alpha was (a file converted from lora_alpha != r merges at the wrong scale everywhere)."""
    from diffusers.utils import convert_state_dict_to_kohya
    from peft import LoraConfig, get_peft_model_state_dict
    torch.manual_seed(5)
    pipe.unet.add_adapter(LoraConfig(r=2, lora_alpha=2, init_lora_weights=False, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    for encoder in (pipe.text_encoder, pipe.text_encoder_2):
        encoder.add_adapter(LoraConfig(r=2, lora_alpha=2, init_lora_weights=False, target_modules=["q_proj", "k_proj", "v_proj", "out_proj"]))
    state = {}
    for prefix, model in (("unet", pipe.unet), ("text_encoder", pipe.text_encoder), ("text_encoder_2", pipe.text_encoder_2)):
        state.update({f"{prefix}.{k}": v for k, v in get_peft_model_state_dict(model).items()})
    save_file({k: v.contiguous() for k, v in convert_state_dict_to_kohya(state).items()}, out / "peft_kohya.safetensors")
    return pipe(PROMPTS, height=16, width=24, num_inference_steps=10, guidance_scale=5.0, latents=latents.clone(),
                output_type="latent").images


def inpaint_unet(pipe, out, mask, image):
    """StableDiffusionXLInpaintPipeline with an inpainting UNet (9 input channels: the latents, the mask, the masked
    image's latents; SDXL's UNet config otherwise), saved as OUT/inpaint_pipe, at strength 1 and 0.6."""
    torch.manual_seed(13)
    unet = randomise(UNet2DConditionModel.from_config({**pipe.unet.config, "in_channels": 9}))
    StableDiffusionXLInpaintPipeline(**dict(pipe.components, unet=unet)).save_pretrained(out / "inpaint_pipe")
    inpaint = StableDiffusionXLInpaintPipeline.from_pretrained(out / "inpaint_pipe")
    tensors = {}
    for name, strength in (("inpaint_unet", 1.0), ("inpaint_unet_strength", 0.6)):
        tensors[f"{name}_latents"] = inpaint(PROMPTS, image=image, mask_image=mask, strength=strength, height=16, width=24,
                                             num_inference_steps=10, guidance_scale=5.0, generator=torch.Generator().manual_seed(7),
                                             output_type="latent").images
    return tensors


def training_step(pipe, out):
    """train_text_to_image_sdxl.py's objective on two 16 x 24 images at the training resolution (original size =
    target size, no crop), captioned CAPTIONS, as the script computes it: both encoders' penultimate hidden states
    side by side, the second's projected pooled output, the time ids, ε prediction's mean squared error."""
    pixels, posterior_noise, noise, timesteps, latents, _ = training_draws(pipe, 2, 16, 24)
    with torch.no_grad():
        embeds = []
        for tokenizer, encoder in ((pipe.tokenizer, pipe.text_encoder), (pipe.tokenizer_2, pipe.text_encoder_2)):
            ids = tokenizer(CAPTIONS, padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
                            return_tensors="pt").input_ids
            states = encoder(ids, output_hidden_states=True, return_dict=False)
            pooled = states[0]  # the last encoder's: its projected pooled output
            embeds.append(states[-1][-2])
        embeds = torch.cat(embeds, dim=-1)
    scheduler = DDPMScheduler.from_pretrained(out / "pipe", subfolder="scheduler")
    noisy = scheduler.add_noise(latents, noise, timesteps)
    time_ids = torch.tensor([[16.0, 24.0, 0.0, 0.0, 16.0, 24.0]] * 2)
    pipe.unet.zero_grad()
    prediction = pipe.unet(noisy, timesteps, embeds, added_cond_kwargs={"time_ids": time_ids, "text_embeds": pooled}).sample
    loss = F.mse_loss(prediction.float(), noise.float(), reduction="mean")
    loss.backward()
    params = dict(pipe.unet.named_parameters())
    tensors = {"train_pixels": pixels, "train_posterior_noise": posterior_noise, "train_noise": noise, "train_timesteps": timesteps,
               "train_latents": latents, "train_text": embeds, "train_pooled": pooled, "train_loss": loss.detach().reshape(1)}
    for name in TRAINING_GRADIENTS:
        tensors[f"train_grad.{name}"] = params[name].grad.clone()
    return tensors


def embedding_sample(pipe_dir, embedding, token, latents, out):
    from safetensors.torch import load_file
    pipe = StableDiffusionXLPipeline.from_pretrained(pipe_dir)
    rows = load_file(embedding)
    pipe.load_textual_inversion(rows["clip_l"], token=token, text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer)
    pipe.load_textual_inversion(rows["clip_g"], token=token, text_encoder=pipe.text_encoder_2, tokenizer=pipe.tokenizer_2)
    with torch.no_grad():
        sampled = pipe([f"a photo of {token}", f"{token} on a mat"], height=16, width=24, num_inference_steps=4, guidance_scale=3.0,
                       latents=load_file(latents)["latents"], output_type="latent").images
    save_file({"latents": sampled.contiguous()}, out)


def lora_sample(pipe_dir, adapter, merged, latents, out):
    from safetensors.torch import load_file
    latents = load_file(latents)["latents"]

    def run(pipe):
        with torch.no_grad():
            return pipe(["a red square, number 1", "a blue square"], height=16, width=24, num_inference_steps=4, guidance_scale=3.0,
                        latents=latents.clone(), output_type="latent").images.contiguous()

    pipe = StableDiffusionXLPipeline.from_pretrained(pipe_dir)
    pipe.load_lora_weights(adapter)
    save_file({"diffusers": run(pipe), "merged": run(StableDiffusionXLPipeline.from_pretrained(merged))}, out)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "build":
        build(sys.argv[2])
    elif len(sys.argv) == 7 and sys.argv[1] == "embedding_sample":
        embedding_sample(*sys.argv[2:])
    elif len(sys.argv) == 7 and sys.argv[1] == "lora_sample":
        lora_sample(*sys.argv[2:])
    else:
        sys.exit(__doc__)
