"""diffusers' text-to-image training step for tests/apps/stable_diffusion/training_test.cpp (nothing is downloaded).

  diffusers_training_reference.py build OUT
      OUT/pipe: the tiny pipeline of diffusers_pipeline_reference.py, and OUT/reference.safetensors: images
      `pixels` [2, 3, 16, 16] in [-1, 1] captioned CAPTIONS, the VAE posterior's noise and the diffusion noise
      [2, 4, 8, 8], timesteps [2]; the latents diffusers' train_text_to_image.py makes of them
      (latent_dist.sample() x scaling_factor, the posterior's draw given); and, for epsilon and v prediction
      without and with Min-SNR-5 weighting (diffusers.training_utils.compute_snr, as the script weights),
      the loss (<prediction>_<gamma>_loss) and the gradients of GRADIENTS (<prediction>_<gamma>.<name>);
      the VAE's objective on the pixels: the reconstruction's mean squared error per image of the decoded
      posterior sample (vae_reconstruction) and diffusers' DiagonalGaussianDistribution.kl() per latent
      element (vae_kl); diffusers' textual_inversion.py step on the same latents, noise and timesteps: the
      concept TI_TOKENS added to the tokenizer (ti_vocab: its size before), the text encoder resized, their
      rows the initializer's (ti_rows), the ids of TI_CAPTIONS (ti_ids), the loss (ti_loss) and the gradient
      of the concept's rows (ti_grad); train_dreambooth.py's step with prior preservation (weight DB_PRIOR_WEIGHT, no
      SNR weighting): two class images' draws (db_class_latents, db_class_noise, db_class_timesteps) beside the two
      instance rows above, captioned DB_INSTANCE and DB_CLASS, the loss (db_loss) and the gradients of GRADIENTS
      (db.<name>); the plain step (epsilon, no SNR weighting) with train_text_to_image.py's noise offset 0.1: the
      per-channel draws (offset_draws [2, 4, 1, 1]), the loss (offset_loss) and gradients (offset.<name>)
  diffusers_training_reference.py check_new_pipeline PIPE CAPTION
      loads PIPE (a folder `kuafu-sd init` wrote) with StableDiffusionPipeline.from_pretrained and prints, as
      JSON, its tokenizer's 77 ids of CAPTION and the parameter count of each model
  diffusers_training_reference.py unet_output PIPE INPUTS OUT
      loads PIPE with StableDiffusionPipeline.from_pretrained and writes its UNet's output on INPUTS'
      sample, timesteps and text to OUT (safetensors, "output")
  diffusers_training_reference.py embedding_sample PIPE EMBEDDING LATENTS OUT
      loads PIPE, then EMBEDDING (a learned_embeds.safetensors) with load_textual_inversion, and writes to OUT
      ("latents") what the pipeline samples for TI_PROMPTS from LATENTS' "latents" (DDIM, 4 steps, guidance 3)
  diffusers_training_reference.py lora_sample PIPE ADAPTER MERGED LATENTS OUT
      what StableDiffusionPipeline samples for LORA_PROMPTS from LATENTS' "latents" (DDIM, 4 steps, guidance 3) with the
      adapter folder ADAPTER loaded by load_lora_weights (UNet and text encoder; "diffusers") and from the merged
      pipeline folder MERGED ("merged"), to OUT
  diffusers_training_reference.py lora_outputs PIPE ADAPTER INPUTS OUT
      the same with the LoRA adapter folder ADAPTER on PIPE's UNet, loaded both ways a user would:
      StableDiffusionPipeline.load_lora_weights (its pytorch_lora_weights.safetensors; "diffusers") and
      peft's PeftModel.from_pretrained on UNet2DConditionModel (its adapter_config.json; "peft")
"""
import pathlib
import sys

import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, StableDiffusionPipeline
from diffusers.training_utils import compute_snr
from safetensors.torch import load_file, save_file

from diffusers_pipeline_reference import save_tiny_pipeline

CAPTIONS = ["a photo of the cat", ""]
# Textual inversion: a two-vector concept. The captions are written out as the script writes its templates
# (every vector's token), with upper case where CLIP's tokenizer lower-cases.
TI_TOKENS = ["<tiny-cat>", "<tiny-cat>_1"]
TI_INITIALIZER = "cat"
TI_CAPTIONS = ["a photo of <tiny-cat> <tiny-cat>_1", "A rendering of <Tiny-Cat>_1 by <tiny-cat> <tiny-cat>_1s"]
TI_PROMPTS = ["a photo of <tiny-cat>", "<tiny-cat> on a mat"]
# DreamBooth with prior preservation.
DB_INSTANCE, DB_CLASS, DB_PRIOR_WEIGHT = "a photo of sks cat", "a photo of a cat", 0.7
GRADIENTS = ["conv_in.weight", "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight", "mid_block.resnets.0.conv1.weight",
             "up_blocks.1.resnets.1.time_emb_proj.weight", "conv_out.bias", "time_embedding.linear_1.weight"]


def training_draws(pipe, seed, height, width):
    """Two random images in [-1, 1] of height x width, the VAE posterior's and the diffusion noise, two timesteps
    and the latents the training scripts make of them (latent_dist.sample() with this draw x scaling_factor)."""
    torch.manual_seed(seed)
    pixels = torch.rand(2, 3, height, width) * 2 - 1
    posterior_noise, noise = torch.randn(2, 4, height // 2, width // 2), torch.randn(2, 4, height // 2, width // 2)
    timesteps = torch.tensor([17, 903])
    with torch.no_grad():
        dist = pipe.vae.encode(pixels).latent_dist
        latents = (dist.mean + dist.std * posterior_noise) * pipe.vae.config.scaling_factor
    return pixels, posterior_noise, noise, timesteps, latents, dist


def build(out):
    out = pathlib.Path(out)
    pipe = save_tiny_pipeline(out)
    pixels, posterior_noise, noise, timesteps, latents, dist = training_draws(pipe, 1, 16, 16)
    with torch.no_grad():
        ids = pipe.tokenizer(CAPTIONS, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
        text = pipe.text_encoder(ids, return_dict=False)[0]
    tensors = {"pixels": pixels, "posterior_noise": posterior_noise, "noise": noise, "timesteps": timesteps, "latents": latents, "text": text}
    with torch.no_grad():
        decoded = pipe.vae.decode(dist.mean + dist.std * posterior_noise).sample
        tensors["vae_reconstruction"] = (decoded - pixels).square().mean(dim=[1, 2, 3])
        tensors["vae_kl"] = dist.kl() / dist.mean[0].numel()
    for prediction in ["epsilon", "v_prediction"]:
        scheduler = DDPMScheduler.from_config(pipe.scheduler.config, prediction_type=prediction)
        for gamma in [0, 5]:
            pipe.unet.zero_grad()
            noisy = scheduler.add_noise(latents, noise, timesteps)
            target = noise if prediction == "epsilon" else scheduler.get_velocity(latents, noise, timesteps)
            pred = pipe.unet(noisy, timesteps, text, return_dict=False)[0]
            if gamma == 0:
                loss = F.mse_loss(pred.float(), target.float(), reduction="mean")
            else:  # train_text_to_image.py's Min-SNR weighting
                snr = compute_snr(scheduler, timesteps)
                weights = torch.stack([snr, gamma * torch.ones_like(timesteps)], dim=1).min(dim=1)[0]
                weights = weights / snr if prediction == "epsilon" else weights / (snr + 1)
                loss = F.mse_loss(pred.float(), target.float(), reduction="none")
                loss = (loss.mean(dim=list(range(1, len(loss.shape)))) * weights).mean()
            loss.backward()
            key = f"{prediction}_{gamma}"
            tensors[key + "_loss"] = loss.detach().reshape(1)
            params = dict(pipe.unet.named_parameters())
            for name in GRADIENTS:
                tensors[f"{key}.{name}"] = params[name].grad.clone()
    offset_noise_step(pipe, latents, noise, timesteps, text, tensors)
    dreambooth_step(pipe, latents, noise, timesteps, tensors)
    textual_inversion_step(pipe, latents, noise, timesteps, tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "reference.safetensors")


def offset_noise_step(pipe, latents, noise, timesteps, text, tensors):
    """train_text_to_image.py's --noise_offset 0.1: one N(0, 1) draw per row and channel, scaled, added to the noise."""
    torch.manual_seed(3)
    draws = torch.randn((latents.shape[0], latents.shape[1], 1, 1))
    offset_noise = noise + 0.1 * draws
    scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    pipe.unet.zero_grad()
    pred = pipe.unet(scheduler.add_noise(latents, offset_noise, timesteps), timesteps, text, return_dict=False)[0]
    loss = F.mse_loss(pred.float(), offset_noise.float(), reduction="mean")
    loss.backward()
    tensors.update(offset_draws=draws, offset_loss=loss.detach().reshape(1))
    params = dict(pipe.unet.named_parameters())
    for name in GRADIENTS:
        tensors[f"offset.{name}"] = params[name].grad.clone()


def dreambooth_step(pipe, latents, noise, timesteps, tensors):
    """train_dreambooth.py's objective with prior preservation (epsilon prediction): instance and class rows in one batch,
    the prediction and target cut in two, the instance half's mean squared error + DB_PRIOR_WEIGHT x the class half's."""
    _, _, class_noise, _, class_latents, _ = training_draws(pipe, 2, 16, 16)
    class_timesteps = torch.tensor([412, 58])
    tensors.update(db_class_latents=class_latents, db_class_noise=class_noise, db_class_timesteps=class_timesteps)
    with torch.no_grad():
        ids = pipe.tokenizer([DB_INSTANCE] * 2 + [DB_CLASS] * 2, padding="max_length", max_length=77, truncation=True,
                             return_tensors="pt").input_ids
        text = pipe.text_encoder(ids, return_dict=False)[0]
    scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    all_latents, all_noise = torch.cat([latents, class_latents]), torch.cat([noise, class_noise])
    all_timesteps = torch.cat([timesteps, class_timesteps])
    pipe.unet.zero_grad()
    pred = pipe.unet(scheduler.add_noise(all_latents, all_noise, all_timesteps), all_timesteps, text, return_dict=False)[0]
    pred, pred_prior = torch.chunk(pred, 2, dim=0)
    target, target_prior = torch.chunk(all_noise, 2, dim=0)
    prior_loss = F.mse_loss(pred_prior.float(), target_prior.float(), reduction="mean")
    loss = F.mse_loss(pred.float(), target.float(), reduction="mean") + DB_PRIOR_WEIGHT * prior_loss
    loss.backward()
    tensors["db_loss"] = loss.detach().reshape(1)
    params = dict(pipe.unet.named_parameters())
    for name in GRADIENTS:
        tensors[f"db.{name}"] = params[name].grad.clone()


def textual_inversion_step(pipe, latents, noise, timesteps, tensors):
    """textual_inversion.py's set-up and objective (epsilon prediction) on PIPE's models, which it changes."""
    tokenizer, text_encoder = pipe.tokenizer, pipe.text_encoder
    tensors["ti_vocab"] = torch.tensor([len(tokenizer)])
    assert tokenizer.add_tokens(TI_TOKENS) == len(TI_TOKENS)
    ids = tokenizer.convert_tokens_to_ids(TI_TOKENS)
    initializer = tokenizer.encode(TI_INITIALIZER, add_special_tokens=False)
    assert len(initializer) == 1
    text_encoder.resize_token_embeddings(len(tokenizer))
    table = text_encoder.get_input_embeddings().weight
    with torch.no_grad():
        for i in ids:
            table[i] = table[initializer[0]].clone()
    input_ids = tokenizer(TI_CAPTIONS, padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
                          return_tensors="pt").input_ids
    scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    text_encoder.zero_grad()
    hidden = text_encoder(input_ids)[0]
    pred = pipe.unet(scheduler.add_noise(latents, noise, timesteps), timesteps, hidden).sample
    loss = F.mse_loss(pred.float(), noise.float(), reduction="mean")
    loss.backward()
    tensors.update({"ti_ids": input_ids, "ti_loss": loss.detach().reshape(1), "ti_grad": table.grad[ids].clone(),
                    "ti_rows": table[ids].detach().clone()})


LORA_PROMPTS = ["a red square, number 1", "a blue square"]


def lora_sample(pipe_dir, adapter, merged, latents, out):
    latents = load_file(latents)["latents"]

    def run(pipe):
        with torch.no_grad():
            return pipe(LORA_PROMPTS, num_inference_steps=4, guidance_scale=3.0, latents=latents.clone(), output_type="latent").images

    pipe = StableDiffusionPipeline.from_pretrained(pipe_dir)
    pipe.load_lora_weights(adapter)
    save_file({"diffusers": run(pipe).contiguous(), "merged": run(StableDiffusionPipeline.from_pretrained(merged)).contiguous()}, out)


def embedding_sample(pipe_dir, embedding, latents, out):
    pipe = StableDiffusionPipeline.from_pretrained(pipe_dir)
    pipe.load_textual_inversion(embedding)
    with torch.no_grad():
        sampled = pipe(TI_PROMPTS, num_inference_steps=4, guidance_scale=3.0, latents=load_file(latents)["latents"],
                       output_type="latent").images
    save_file({"latents": sampled.contiguous()}, out)


def check_new_pipeline(pipe_dir, caption):
    import json
    pipe = StableDiffusionPipeline.from_pretrained(pipe_dir)
    ids = pipe.tokenizer(caption, padding="max_length", max_length=77, truncation=True).input_ids
    count = lambda model: sum(p.numel() for p in model.parameters())
    print(json.dumps({"ids": ids, "unet": count(pipe.unet), "vae": count(pipe.vae), "text_encoder": count(pipe.text_encoder)}))


def unet_output(pipe, inputs, out):
    pipe = StableDiffusionPipeline.from_pretrained(pipe)
    given = load_file(inputs)
    with torch.no_grad():
        output = pipe.unet(given["sample"], given["timesteps"], given["text"], return_dict=False)[0]
    save_file({"output": output.contiguous()}, out)


def lora_outputs(pipe_dir, adapter, inputs, out):
    from diffusers import UNet2DConditionModel
    from peft import PeftModel
    given = load_file(inputs)
    args = (given["sample"], given["timesteps"], given["text"])
    pipe = StableDiffusionPipeline.from_pretrained(pipe_dir)
    pipe.load_lora_weights(adapter)
    peft_unet = PeftModel.from_pretrained(UNet2DConditionModel.from_pretrained(pathlib.Path(pipe_dir) / "unet"), adapter)
    kohya = StableDiffusionPipeline.from_pretrained(pipe_dir)  # the folder's kohya file, as ComfyUI users load it
    kohya.load_lora_weights(adapter, weight_name="kohya_lora.safetensors")
    with torch.no_grad():
        outputs = {"diffusers": pipe.unet(*args, return_dict=False)[0], "peft": peft_unet(*args, return_dict=False)[0],
                   "kohya": kohya.unet(*args, return_dict=False)[0]}
    save_file({k: v.contiguous() for k, v in outputs.items()}, out)


if __name__ == "__main__":
    commands = {"build": build, "unet_output": unet_output, "lora_outputs": lora_outputs, "check_new_pipeline": check_new_pipeline,
                "embedding_sample": embedding_sample, "lora_sample": lora_sample}
    if len(sys.argv) < 3 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
