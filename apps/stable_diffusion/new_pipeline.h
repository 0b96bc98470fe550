// `kuafu-sd init`: a new diffusers pipeline folder for a model trained from scratch, its shapes from the
// config's init.* keys: a character-level CLIP tokenizer (no merges: any caption spelt out), a CLIP text
// encoder, a VAE and a UNet in Stable Diffusion's layout (cross-attention in every down block but the
// last and every up block but the first), all freshly initialised from train.seed, and SD's DDIM
// schedule (scaled-linear betas 0.00085 .. 0.012, leading spacing, offset 1). The VAE is then trained
// (model.train = "vae"), the UNet after it; the text encoder stays as drawn, a fixed random embedding of
// the captions the UNet learns to read.
#pragma once

#include <string>

#include "apps/stable_diffusion/clip_text_model.h"
#include "apps/stable_diffusion/noise_schedule.h"
#include "apps/stable_diffusion/unet.h"
#include "apps/stable_diffusion/vae.h"
#include "core/config/config.h"

namespace kuafu::sd {

struct NewPipelineShape {
  ClipTextConfig text;
  VaeConfig vae;
  UNetConfig unet;
  SchedulerConfig scheduler;
};

void add_init_schema(config::Schema& schema);
// The init.* keys as shapes; kuafu::Error at the key for one that does not fit (groups, heads).
NewPipelineShape new_pipeline_shape(const config::Config& config);

// Writes the new folder `out` (an existing one is refused), its weights drawn from `seed`.
void write_new_pipeline(const NewPipelineShape& shape, const std::string& out, uint64_t seed);

}  // namespace kuafu::sd
