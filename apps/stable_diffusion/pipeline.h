// A diffusers Stable Diffusion pipeline folder (model_index.json naming tokenizer/, text_encoder/, unet/,
// vae/ and scheduler/; a safety checker and feature extractor are skipped with a warning, any other
// component refused by name) and text-to-image sampling over it: the prompts and the empty prompt
// through CLIP, the UNet under classifier-free guidance stepped by a sampler, the VAE's decoding.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/stable_diffusion/clip_text_model.h"
#include "apps/stable_diffusion/prompt_tokens.h"
#include "apps/stable_diffusion/samplers.h"
#include "apps/stable_diffusion/unet.h"
#include "apps/stable_diffusion/vae.h"
#include "core/io/hf_folder.h"
#include "core/io/png_file.h"

namespace kuafu::sd {

// scheduler/scheduler_config.json: the schedule (each class's own defaults where a key is absent: leading
// spacing and x̂₀ clipping for DDIM and DDPM, linspace and none for Euler and DPM-Solver) and the sampler
// its class names (none for a class Kuafu does not step, e.g. PNDMScheduler: the schedule still reads,
// and the caller names a sampler). Features the samplers do not compute are refused naming the key.
struct SchedulerFolder {
  SchedulerConfig config;
  std::string class_name;
  std::optional<SamplerKind> sampler;
  // The schedule another sampler reads from this folder: keys the folder lacks take that sampler's class
  // defaults, as diffusers' from_config gives them (DDIM from an Euler folder clips x̂₀; Euler never does).
  SchedulerConfig config_for(SamplerKind kind) const;
  nlohmann::json json;  // scheduler_config.json as read
  std::string where;
};
SchedulerFolder read_scheduler_config(const nlohmann::json& json, const std::string& where);

struct Pipeline {
  PromptTokenizer tokenizer;
  ClipTextModel text_encoder{nullptr};
  UNet2DCondition unet{nullptr};
  AutoencoderKL vae{nullptr};
  SchedulerFolder scheduler;
  // SDXL (StableDiffusionXLPipeline): the second tokenizer and text encoder (a CLIPTextModelWithProjection),
  // whose projected pooled output joins the UNet's time embedding; unset for SD 1.x and 2.x.
  PromptTokenizer tokenizer_2;
  ClipTextModel text_encoder_2{nullptr};
  bool force_zeros_for_empty_prompt = true;  // SDXL: without a negative prompt the guidance's rows are zeros
  // Textual inversion's tokens (the tokenizers' added ids, in order): their embeddings in each text encoder,
  // [n, D1] and (SDXL) [n, D2]; undefined when none was added.
  torch::Tensor added_token_rows, added_token_rows_2;
  int64_t vae_scale() const { return vae->config.scale_factor(); }  // pixels per latent
  // Pixels an image's sides must divide by: the VAE's factor times the UNet's downsamplings.
  int64_t size_multiple() const { return vae_scale() << (unet->config.block_out_channels.size() - 1); }
  bool sdxl() const { return !text_encoder_2.is_empty(); }
};

// What the UNet attends to and (SDXL) the pooled text it adds to its time embedding, for N texts.
struct PromptEmbeddings {
  torch::Tensor text;    // [N, M, D]: SD 1.x/2.x the encoder's last hidden states; SDXL both encoders' penultimate
                         //   hidden states side by side (D = D1 + D2)
  torch::Tensor pooled;  // [N, P]: SDXL the second encoder's projected pooled output; undefined otherwise
};
// Gradients reach the added token rows unless the caller turns them off.
PromptEmbeddings encode_prompts(Pipeline& pipeline, const std::vector<std::string>& texts);

// SDXL's time ids [rows, 6] of an image of height × width pixels, uncropped, as diffusers' pipeline makes
// them: (original height, width, crop top, left, target height, width).
torch::Tensor sdxl_time_ids(int64_t rows, int64_t height, int64_t width, const torch::TensorOptions& options);
// What load_pipeline makes of each model: the dtype its weights are read straight into (a frozen model's
// compute dtype), and whether the UNet is only described (on the meta device, config and names but no
// storage) for a caller that builds the UNet as its training holds it.
struct PipelineLoad {
  torch::Dtype text_encoder = torch::kFloat32, unet = torch::kFloat32, vae = torch::kFloat32;
  bool describe_unet = false;
};
Pipeline load_pipeline(const std::string& dir, const torch::Device& device = torch::kCPU, const PipelineLoad& how = {});

// A component written anew into a pipeline folder: its folder's name ("unet", "vae") and how to write
// that (new) folder.
struct PipelineComponent {
  std::string name;
  std::function<void(const std::string& dir)> write;
};
// Writes a new pipeline folder `out`: every component of the folder `source` (none when empty) as it is
// but those `replaced` writes (a trained UNet or VAE). Built under a temporary name and renamed into place; an
// existing `out` is refused, so nothing saved is ever overwritten.
void write_pipeline(const std::string& source, const std::string& out, const std::vector<PipelineComponent>& replaced);

struct SampleOptions {
  int64_t steps = 50;
  double guidance = 7.5;
  double guidance_rescale = 0.0;            // rescale_guidance's mix (diffusers' guidance_rescale); 0: none
  double eta = 0.0;                         // DDIM's η (its noise from the seed's generator); 0: deterministic
  std::vector<std::string> negative_prompts;  // the guidance's unconditional text: one for every prompt, or
                                              // one each; none: the empty caption
  std::optional<SamplerKind> sampler;  // else the folder's scheduler class
  std::optional<bool> karras_sigmas;   // Euler and DPM-Solver's σ spacing; else the folder's use_karras_sigmas
  uint64_t seed = 0;                   // the CPU generator's: initial latents, then each stochastic step's noise
  torch::Tensor initial_latents;       // [B, latent, h, w] N(0, 1) draws (scaled by the sampler's σ), else from the seed
  int64_t height = 0, width = 0;       // pixels; 0: the UNet's sample_size × the VAE's factor
  int64_t vae_tile = 0;                // pixels: decode in overlapping tiles of this side (0: whole)
  int64_t images_per_prompt = 1;       // rows per prompt, next to each other (diffusers' num_images_per_prompt)
  bool decode = true;                  // false: the latents only, no images (diffusers' output_type="latent")
  // img2img (diffusers' StableDiffusionImg2ImgPipeline): the image to start from [1 or B, 3, H, W] in [0, 1]
  // (H and W multiples of the VAE's factor; one image serves every row), encoded by the VAE, a sample of its
  // latent distribution noised to the step `strength` leaves: the last ⌊steps · strength⌋ steps are taken.
  torch::Tensor init_image;
  double strength = 0.8;
  // Inpainting (diffusers' StableDiffusionInpaintPipeline): where to repaint [1 or B, 1, H, W] in [0, 1] (≥ 0.5:
  // repainted), beside init_image. An inpainting UNet (2 × latent + 1 input channels) also sees the mask at the
  // latents' size and the latents of the image with the repainted part blanked; with a plain UNet the image's
  // known part is put back after every step, noised to the next (diffusers' legacy way). At strength 1 sampling
  // starts from pure noise, below it as img2img does.
  torch::Tensor mask_image;
};

// B = prompts × images_per_prompt rows, each prompt's images next to each other.
struct Samples {
  torch::Tensor initial_latents;         // [B, latent, h, w], as drawn (before the sampler's scaling; img2img: the
                                         //   noise added to the image's latents)
  torch::Tensor latents;                 // [B, latent, h, w], the sampler's last
  torch::Tensor images;                  // [B, 3, H, W] in [0, 1]; undefined without decode
  torch::Tensor prompt_embeds;           // [B, M, D] the text encoder's last hidden states the UNet attends to
  torch::Tensor negative_prompt_embeds;  // [B, M, D] the unconditional rows' (undefined without guidance)
};
// The UNet and text encoder compute in their weights' dtype (a bf16 run's); the sampler's latents and
// steps stay float32, and the VAE decodes in float32 whatever its weights' dtype (diffusers' force_upcast:
// a reduced-precision decoding loses the image's fine values, and in fp16 overflows to black).
Samples sample(Pipeline& pipeline, const std::vector<std::string>& prompts, const SampleOptions& options);

// The sampler's loop: from `latents` [B, C, h, w] (float32, already scaled by init_noise_sigma, or noised to
// the sampler's first step) through every step of `sampler` from its first, the UNet computing in its weights' dtype on `text` [(2)B, M, D] (the empty
// caption's rows first when guided, as sample() builds them) and, for SDXL, `added` (rows as text's); a stochastic sampler's noise drawn from
// `generator` on the CPU. Returns the last latents [B, C, h, w], float32.
// What inpainting adds to the loop: with an inpainting UNet `condition` [(2)B, c, h, w] (the mask and the masked
// image's latents, rows as `text`'s) after the latents in every model input's channels; with one that does not
// inpaint, `blend` applied to the latents after each step i (the known part put back, noised for step i + 1).
struct Inpainting {
  torch::Tensor condition;
  std::function<torch::Tensor(const torch::Tensor& latents, size_t i)> blend;
};
torch::Tensor denoise(UNet2DCondition& unet, Sampler& sampler, torch::Tensor latents, const torch::Tensor& text, double guidance,
                      at::Generator& generator, double guidance_rescale = 0.0, const Inpainting& inpainting = {},
                      const AddedConditions& added = {});

// A sample grid's PNG text chunks: the prompts (" | " between them), `seed` as given, steps and guidance.
std::vector<std::pair<std::string, std::string>> sample_png_text(const std::vector<std::string>& prompts, const std::string& seed,
                                                                 const SampleOptions& options);

// images [B, 3 or 1, H, W] in [0, 1] -> one RGB grid, `columns` images a row (0: all in one row; B must
// divide by it), the rows in order.
io::RgbImage sample_grid(const torch::Tensor& images, int64_t columns = 0);

}  // namespace kuafu::sd
