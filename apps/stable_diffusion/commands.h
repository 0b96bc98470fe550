// kuafu-sd's training commands on the app skeleton (core/train/app.h): train and finetune (the UNet of a
// diffusers pipeline folder, its text encoder and VAE frozen), eval, export (a whole pipeline folder
// diffusers loads, the UNet's moving average when optim.ema_decay is set) and benchmark (UNet training
// steps on random latents). `sample` has its own command line (sample_command.h).
#pragma once

#include "apps/stable_diffusion/train_task.h"
#include "core/train/app.h"

namespace kuafu::sd {

// The App of the shared commands, its settings read from `config` (which must outlive it).
std::unique_ptr<train::App> make_sd_app(const config::Config& config);

// The whole program but `sample`; returns the exit code.
int run_sd_app(int argc, const char* const argv[]);

}  // namespace kuafu::sd
