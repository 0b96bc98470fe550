"""The sampling loop `kuafu-sd benchmark --set benchmark.sampling_steps=N` times, in diffusers on the same
torch (the checkout's venv), to compare UNet sampling steps/s on one machine.

diffusers' UNet2DConditionModel built from a unet/config.json (random weights; nothing downloaded), its
default attention (PyTorch's fused scaled_dot_product_attention), DDIMScheduler stepping STEPS steps
under classifier-free guidance 7.5 (the UNet on [unconditional; conditional] rows, as
StableDiffusionPipeline runs it) from random initial latents and random text encodings (an SDXL UNet: also a
random pooled text and its size's time ids), no VAE and no text encoder: the same work as Kuafu's line. The median of REPEATS timed loops after one warm-up loop,
synchronised on the device. Prints one JSON line.

usage: .venv/bin/python benchmarks/sd_sampling_diffusers.py UNET_DIR [STEPS=50] [REPEATS=3] [fp32|bf16]
           [cpu|cuda] [BATCH=1] [THREADS=2]
"""
import json
import statistics
import sys
import time

import torch
from diffusers import DDIMScheduler, UNet2DConditionModel

GUIDANCE = 7.5


def main():
    unet_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    precision = sys.argv[4] if len(sys.argv) > 4 else "fp32"
    device = sys.argv[5] if len(sys.argv) > 5 else "cpu"
    batch = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    torch.set_num_threads(int(sys.argv[7]) if len(sys.argv) > 7 else 2)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]

    config = UNet2DConditionModel.load_config(unet_dir)
    unet = UNet2DConditionModel.from_config(config).to(device=device, dtype=dtype).eval()
    side, channels = unet.config.sample_size, unet.config.in_channels
    latents0 = torch.randn(batch, channels, side, side, device=device)  # [B, C, h, w]
    text = torch.randn(2 * batch, 77, unet.config.cross_attention_dim, device=device, dtype=dtype)  # [2B, 77, D]
    added = None  # SDXL's: a random pooled text and the time ids of the sample's size in pixels (VAE factor 8)
    if unet.config.addition_embed_type == "text_time":
        pooled = unet.config.projection_class_embeddings_input_dim - 6 * unet.config.addition_time_embed_dim
        pixels = 8 * side
        added = {"text_embeds": torch.randn(2 * batch, pooled, device=device, dtype=dtype),
                 "time_ids": torch.tensor([[pixels, pixels, 0, 0, pixels, pixels]] * (2 * batch), device=device, dtype=dtype)}
    scheduler = DDIMScheduler()

    def loop():
        scheduler.set_timesteps(steps, device=device)
        latents = latents0 * scheduler.init_noise_sigma
        for t in scheduler.timesteps:
            rows = scheduler.scale_model_input(torch.cat([latents, latents]), t).to(dtype)
            out = unet(rows, t, encoder_hidden_states=text, added_cond_kwargs=added).sample.float()
            unconditional, conditional = out.chunk(2)
            prediction = unconditional + GUIDANCE * (conditional - unconditional)
            latents = scheduler.step(prediction, t, latents).prev_sample
        return latents

    def synchronise():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    times = []
    with torch.no_grad():
        for i in range(repeats + 1):
            synchronise()
            start = time.perf_counter()
            loop()
            synchronise()
            if i > 0:
                times.append(time.perf_counter() - start)
    median = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None
    print(json.dumps({"tool": "diffusers", "parameters": sum(p.numel() for p in unet.parameters()), "batch": batch,
                      "precision": precision, "device": device, "sampler": "ddim", "sampling_steps": steps,
                      "guidance": GUIDANCE, "latent_size": side, "loop_s_median": median,
                      "sampling_steps_per_s": steps / median, "ms_per_sampling_step": median * 1e3 / steps,
                      "peak_allocated_mb": peak, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
