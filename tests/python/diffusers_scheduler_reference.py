"""diffusers' schedulers for tests/apps/stable_diffusion/scheduler_test.cpp (nothing is downloaded).

  diffusers_scheduler_reference.py build OUT
      OUT/reference.safetensors, for each config below (prefix NAME/):
        alphas_cumprod                 diffusers' ᾱ (float32, stored as float64)
        alphas_cumprod_f64             the same betas and rescale in float64 (diffusers' formulas, its
                                       betas_for_alpha_bar and rescale_zero_terminal_snr on float64)
        timesteps_N                    DDIMScheduler.set_timesteps(N)'s list for N in STEPS
        sample, outputs                x_t [2, 4, 8, 8] and one model output per step of a 10-step schedule
        ddim_diffusers                 DDIMScheduler.step of each (x_t, output_i, timesteps[i]), not chained
        ddim_listed                    the same by DDIM's eq. 12 (η = 0) transcribed here, stepping to the
                                       schedule's own next timestep (diffusers' t − T/N leaves the list
                                       under linspace spacing)
        ddpm                           DDPMScheduler.step of each, its noise drawn from a CPU generator
                                       seeded 100 + i
        snr, min_snr_5                 SNR(t) for every t and Min-SNR-5 weights (Hang et al. transcribed),
                                       both from the float64 ᾱ (float32's 1 − ᾱ near ᾱ = 1 loses digits)
        noised, velocity               add_noise and get_velocity of (sample, outputs[0]) at timesteps 10 and 900
        euler_*, dpm_*                 EulerDiscreteScheduler and DPMSolverMultistepScheduler (DPM-Solver++ 2M)
                                       on the same config: timesteps, sigmas and init_noise_sigma of 10 steps,
                                       timesteps_N for N in STEPS, and a 10-step loop from sample x
                                       init_noise_sigma with outputs[i] at step i: each step's x (chained) and
                                       Euler's scaled model inputs
        unipc_*                        UniPCMultistepScheduler (bh2, order 2, its corrector) the same way
        euler_karras_*, dpm_karras_*, unipc_karras_*   the same with use_karras_sigmas=True
        euler_a_steps                  EulerAncestralDiscreteScheduler's 10-step loop the same way, step i's
                                       noise from a CPU generator seeded 200 + i
        heun_*, heun_karras_*          HeunDiscreteScheduler as euler_*, its 19 model calls of 10 steps given
                                       heun_outputs [19, 2, 4, 8, 8] (not for zero_snr_v: diffusers' Heun has no
                                       zero-SNR rescale)
"""
import math
import pathlib
import sys

import numpy as np
import torch
from diffusers import (DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                       EulerDiscreteScheduler, HeunDiscreteScheduler, UniPCMultistepScheduler)
from diffusers.schedulers.scheduling_ddim import betas_for_alpha_bar, rescale_zero_terminal_snr
from safetensors.torch import save_file

CONFIGS = {
    # Stable Diffusion 1.x's scheduler_config.json.
    "sd15": dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1, set_alpha_to_one=False,
                 clip_sample=False, timestep_spacing="leading"),  # each class's default spacing differs: name it
    # Zero terminal SNR with v-prediction and trailing spacing (Lin et al. 2023).
    "zero_snr_v": dict(rescale_betas_zero_snr=True, timestep_spacing="trailing", prediction_type="v_prediction",
                       clip_sample=False),
    # Glide's cosine schedule, linspace spacing, x̂₀ clipped.
    "cosine_linspace": dict(beta_schedule="squaredcos_cap_v2", timestep_spacing="linspace"),
}
STEPS = [1, 2, 3, 7, 10, 30, 50, 333, 999, 1000]
GAMMA = 5.0


def ddim_listed(alphas_cumprod, final, config, output, t, t_prev, x):
    a = alphas_cumprod[t].double()
    a_prev = alphas_cumprod[t_prev].double() if t_prev >= 0 else torch.tensor(final, dtype=torch.float64)
    x, output = x.double(), output.double()
    if config.get("prediction_type", "epsilon") == "v_prediction":
        x0, eps = a.sqrt() * x - (1 - a).sqrt() * output, a.sqrt() * output + (1 - a).sqrt() * x
    else:
        x0, eps = (x - (1 - a).sqrt() * output) / a.sqrt(), output
    if config.get("clip_sample", True):
        x0 = x0.clamp(-1, 1)
    return a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps


def alphas_cumprod_f64(config):
    start, end, schedule = config.get("beta_start", 0.0001), config.get("beta_end", 0.02), config.get("beta_schedule", "linear")
    if schedule == "linear":
        betas = torch.linspace(start, end, 1000, dtype=torch.float64)
    elif schedule == "scaled_linear":
        betas = torch.linspace(start**0.5, end**0.5, 1000, dtype=torch.float64) ** 2
    else:
        betas = torch.tensor([min(1 - alpha_bar(i + 1) / alpha_bar(i), 0.999) for i in range(1000)], dtype=torch.float64)
    if config.get("rescale_betas_zero_snr", False):
        betas = rescale_zero_terminal_snr(betas)
    return torch.cumprod(1 - betas, 0)


def alpha_bar(i):
    return math.cos((i / 1000 + 0.008) / 1.008 * math.pi / 2) ** 2


def min_snr(snr, prediction):
    clipped = torch.minimum(snr, torch.full_like(snr, GAMMA))
    return clipped / (snr + 1) if prediction == "v_prediction" else clipped / snr


def build(out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, config in CONFIGS.items():
        ddim = DDIMScheduler(**config)
        tensors[f"{name}/alphas_cumprod"] = ddim.alphas_cumprod.double()
        for n in STEPS:
            if name == "sd15" and n == 1000:
                continue  # leading spacing with steps_offset 1 gives timestep 1000, past the schedule
            ddim.set_timesteps(n)
            tensors[f"{name}/timesteps_{n}"] = ddim.timesteps.to(torch.int64)
        torch.manual_seed(0)
        sample = torch.randn(2, 4, 8, 8)
        outputs = torch.randn(10, 2, 4, 8, 8)
        tensors[f"{name}/sample"], tensors[f"{name}/outputs"] = sample, outputs
        ddim.set_timesteps(10)
        timesteps = [int(t) for t in ddim.timesteps]
        final = 1.0 if config.get("set_alpha_to_one", True) else float(ddim.alphas_cumprod[0])
        tensors[f"{name}/ddim_diffusers"] = torch.stack(
            [ddim.step(outputs[i], t, sample).prev_sample for i, t in enumerate(timesteps)])
        tensors[f"{name}/ddim_listed"] = torch.stack(
            [ddim_listed(ddim.alphas_cumprod, final, config, outputs[i], t, timesteps[i + 1] if i + 1 < 10 else -1, sample)
             for i, t in enumerate(timesteps)])
        ddpm = DDPMScheduler(**{k: v for k, v in config.items() if k != "set_alpha_to_one"})
        ddpm.set_timesteps(10)
        tensors[f"{name}/ddpm"] = torch.stack(
            [ddpm.step(outputs[i], t, sample, generator=torch.Generator().manual_seed(100 + i)).prev_sample
             for i, t in enumerate(ddpm.timesteps)])
        rows = torch.tensor([10, 900])
        tensors[f"{name}/noised"] = ddpm.add_noise(sample, outputs[0], rows)
        tensors[f"{name}/velocity"] = ddpm.get_velocity(sample, outputs[0], rows)
        a = alphas_cumprod_f64(config)
        tensors[f"{name}/alphas_cumprod_f64"] = a
        snr = a / (1 - a)
        tensors[f"{name}/snr"] = snr
        tensors[f"{name}/min_snr_5"] = min_snr(snr, config.get("prediction_type", "epsilon"))
        for prefix, kind in (("euler", EulerDiscreteScheduler), ("dpm", DPMSolverMultistepScheduler), ("unipc", UniPCMultistepScheduler)):
            tensors.update(sigma_sampler(f"{name}/{prefix}", kind(**sigma_config(config)), sample, outputs))
            karras = kind(**sigma_config(config), use_karras_sigmas=True)
            tensors.update(sigma_sampler(f"{name}/{prefix}_karras", karras, sample, outputs))
        if not config.get("rescale_betas_zero_snr"):
            heun_outputs = torch.randn(19, 2, 4, 8, 8)
            tensors[f"{name}/heun_outputs"] = heun_outputs
            tensors.update(sigma_sampler(f"{name}/heun", HeunDiscreteScheduler(**sigma_config(config)), sample, heun_outputs))
            karras = HeunDiscreteScheduler(**sigma_config(config), use_karras_sigmas=True)
            tensors.update(sigma_sampler(f"{name}/heun_karras", karras, sample, heun_outputs))
        ancestral = EulerAncestralDiscreteScheduler(**sigma_config(config))
        ancestral.set_timesteps(10)
        x, steps = sample * ancestral.init_noise_sigma, []
        for i, t in enumerate(ancestral.timesteps):
            x = ancestral.step(outputs[i], t, x, generator=torch.Generator().manual_seed(200 + i)).prev_sample
            steps.append(x)
        tensors[f"{name}/euler_a_steps"] = torch.stack(steps)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "reference.safetensors")


def sigma_config(config):
    return {k: v for k, v in config.items() if k not in ("set_alpha_to_one", "clip_sample")}


def sigma_sampler(prefix, scheduler, sample, outputs):
    tensors = {}
    for n in STEPS:
        if n >= 999 and scheduler.config.steps_offset:
            continue  # leading spacing with an offset passes the schedule there
        scheduler.set_timesteps(n)
        tensors[f"{prefix}_timesteps_{n}"] = scheduler.timesteps.double()
    scheduler.set_timesteps(10)
    # From the list's first step: diffusers otherwise starts at a repeated first timestep's second place
    # (Karras σ under zero SNR round several to 999) and steps past the end.
    scheduler.set_begin_index(0)
    tensors[f"{prefix}_sigmas"] = scheduler.sigmas.double()
    tensors[f"{prefix}_init_noise_sigma"] = torch.tensor(float(scheduler.init_noise_sigma), dtype=torch.float64)
    x = sample * scheduler.init_noise_sigma
    steps, inputs = [], []
    for i, t in enumerate(scheduler.timesteps):
        inputs.append(scheduler.scale_model_input(x, t))
        x = scheduler.step(outputs[i], t, x).prev_sample
        steps.append(x)
    tensors[f"{prefix}_inputs"], tensors[f"{prefix}_steps"] = torch.stack(inputs), torch.stack(steps)
    return tensors


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "build":
        sys.exit(__doc__)
    build(sys.argv[2])
