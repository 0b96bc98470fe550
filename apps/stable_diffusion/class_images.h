// DreamBooth's class images (prior preservation): samples of the pipeline itself for dreambooth.class_prompt,
// which the fine-tuning keeps drawing beside the instance's images so the class does not drift toward the
// instance (diffusers' train_dreambooth.py makes them the same way before training).
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "apps/stable_diffusion/sd_settings.h"

namespace kuafu::sd {

// The images (PNG, JPEG) under dreambooth.class_data; 0 when the folder does not exist.
int64_t count_class_images(const DreamBoothSettings& settings);

// Samples the images dreambooth.class_data lacks of dreambooth.class_images with the pipeline folder
// (float32 on `device`): <class_data>/class/<n>.png with <n>.txt holding the class prompt, image n from the
// seed train.seed + n (DDIM or the folder's sampler, dreambooth.class_sample_steps, class_guidance), so a
// stopped run makes the same rest. Returns how many it made.
int64_t make_class_images(const SdSettings& settings, const torch::Device& device);

}  // namespace kuafu::sd
