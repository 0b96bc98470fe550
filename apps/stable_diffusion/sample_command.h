// kuafu-sd sample: text to images from a diffusers pipeline folder, written as one PNG grid (the prompts
// side by side, a row per --seed) whose text chunks hold the prompts, seeds, steps, guidance and sampler.
// --save-latents writes the initial noise (safetensors, "latents"); --latents starts from such a file, so
// a run can be compared with any other tool's from the same noise.
#pragma once

namespace kuafu::sd {

int run_sample(int argc, const char* const argv[]);

}  // namespace kuafu::sd
