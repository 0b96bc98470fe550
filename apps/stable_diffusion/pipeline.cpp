#include "apps/stable_diffusion/pipeline.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

#include "apps/stable_diffusion/clip_hugging_face.h"
#include "apps/stable_diffusion/unet_folder.h"
#include "apps/stable_diffusion/vae_folder.h"
#include "core/io/hf_folder.h"
#include "core/io/json_file.h"
#include "core/train/checkpoint.h"
#include "core/train/lazy_model.h"
#include "core/train/model_memory.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/logging.h"
#include "core/util/text.h"

namespace kuafu::sd {

namespace fs = std::filesystem;

namespace {

// A float32 VAE on `device` holding `vae`'s (reduced-precision) weights, for decoding.
AutoencoderKL float32_copy(const AutoencoderKL& vae, const torch::Device& device) {
  train::ModelRecipe<AutoencoderKL> copy{"", /*trained=*/false};
  copy.describe = train::described_whole<AutoencoderKL>(vae->config);
  copy.draw = [vae](AutoencoderKL& fresh) { train::copy_named_weights(train::named_weights(*vae), *fresh); };
  AutoencoderKL made = train::build_as(copy, train::Materialization::all_in(device, torch::kFloat32));
  made->eval();
  return made;
}

// Refuses a request whose activations the machine cannot hold, before anything of its size is made. The
// estimate is from below (float32): a full-resolution UNet convolution's input and output for every
// text row, or the VAE decoder's at full resolution (one tile's with --vae-tile) beside the decoded
// images; a request it refuses could never run.
void check_sampling_fits(Pipeline& p, int64_t rows, int64_t latent_h, int64_t latent_w, bool guided, int64_t vae_tile,
                         int64_t steps, const torch::Device& device) {
  constexpr double kFloat32 = 4;
  const double images = static_cast<double>(rows), latents = static_cast<double>(latent_h) * static_cast<double>(latent_w);
  const double unet = 2 * images * (guided ? 2 : 1) * static_cast<double>(p.unet->config.block_out_channels.front()) * latents * kFloat32;
  const double scale = static_cast<double>(p.vae_scale()), pixels = latents * scale * scale;  // per image
  const double tile = vae_tile > 0 ? std::min(pixels, static_cast<double>(vae_tile) * static_cast<double>(vae_tile)) : pixels;
  const double decoder = (2 * static_cast<double>(p.vae->config.block_out_channels.front()) * tile + 3 * pixels) * images * kFloat32;
  std::ostringstream what;
  what << "sampling " << rows << " image(s) of " << latent_w * p.vae_scale() << "x" << latent_h * p.vae_scale() << " pixels";
  train::check_bytes_fit(std::max(unet, decoder), device, what.str(),
                         vae_tile > 0 ? "Ask for smaller images (--height, --width)"
                                      : "Ask for smaller images (--height, --width), or decode in tiles (--vae-tile)");
  // A request that fits may still take hours (attention grows with the square of the latents): say so first.
  const double flops = static_cast<double>(steps) * images * (guided ? 2 : 1) *
                       p.unet->config.forward_flops(latent_h, latent_w, p.tokenizer.max_length());
  constexpr double kWorthSaying = 1e13;
  if (flops < kWorthSaying) return;
  const double seconds = flops / train::measure_matmul_flops(device, p.unet->conv_in->weight.scalar_type());
  if (seconds > 60) log::warnf(what.str(), ": ", steps, " UNet steps of about ", flops / steps / 1e12, " TFLOP each, some ",
                               static_cast<int64_t>(seconds / 60), " minutes at this machine's matrix-product rate");
}

// Whether model_index.json's entry names a component ([library, class]), not a left-out one (null, [null, null]) or
// a flag.
bool names_component(const nlohmann::json& value) {
  return !value.is_null() && !value.is_boolean() && !(value.is_array() && !value.empty() && value[0].is_null());
}

// The schedule of scheduler_config.json as a sampler of the class `kind` reads it (none: a class Kuafu does not
// step), its class's defaults where a key is absent.
SchedulerConfig schedule_of(const nlohmann::json& json, const std::string& where, std::optional<SamplerKind> kind) {
  const bool sigma = kind && walks_sigma(*kind);
  SchedulerConfig c;
  c.num_train_timesteps = io::config_value<int64_t>(json, "num_train_timesteps", 1000, where);
  c.beta_start = io::config_value<double>(json, "beta_start", 0.0001, where);
  c.beta_end = io::config_value<double>(json, "beta_end", 0.02, where);
  c.beta_schedule = beta_schedule_named(io::config_value<std::string>(json, "beta_schedule", "linear", where));
  c.rescale_betas_zero_snr = io::config_value<bool>(json, "rescale_betas_zero_snr", false, where);
  c.timestep_spacing = timestep_spacing_named(io::config_value<std::string>(json, "timestep_spacing", sigma ? "linspace" : "leading", where));
  c.steps_offset = io::config_value<int64_t>(json, "steps_offset", 0, where);
  c.set_alpha_to_one = io::config_value<bool>(json, "set_alpha_to_one", true, where);
  c.prediction_type = prediction_named(io::config_value<std::string>(json, "prediction_type", "epsilon", where));
  c.clip_sample = !sigma && io::config_value<bool>(json, "clip_sample", true, where);
  c.clip_sample_range = io::config_value<double>(json, "clip_sample_range", 1.0, where);
  c.karras_sigmas = io::config_value<bool>(json, "use_karras_sigmas", false, where);  // the σ samplers' but Euler ancestral's
  KUAFU_CHECK(!json.contains("trained_betas") || json["trained_betas"].is_null(), where, ": trained_betas is not supported");
  return c;
}

}  // namespace

SchedulerConfig SchedulerFolder::config_for(SamplerKind kind) const { return schedule_of(json, where, kind); }

SchedulerFolder read_scheduler_config(const nlohmann::json& json, const std::string& where) {
  SchedulerFolder s;
  s.class_name = io::config_value<std::string>(json, "_class_name", "", where);
  try {
    s.sampler = sampler_named(s.class_name);
  } catch (const Error&) {
    s.sampler.reset();  // a class Kuafu does not step: the schedule still reads
  }
  s.config = schedule_of(json, where, s.sampler);
  s.json = json;
  s.where = where;
  const std::vector<std::pair<std::string, nlohmann::json>> computed = {
      {"thresholding", false},      {"sigma_min", nullptr},       {"use_exponential_sigmas", false}, {"use_beta_sigmas", false},
      {"sigma_max", nullptr},
      {"use_lu_lambdas", false},    {"final_sigmas_type", "zero"}, {"algorithm_type", "dpmsolver++"}, {"solver_order", 2},
      {"solver_type", s.sampler == SamplerKind::kUniPc ? "bh2" : "midpoint"},  {"euler_at_final", false},
      {"interpolation_type", "linear"},  {"timestep_type", "discrete"},   {"variance_type", "fixed_small"},
      {"predict_x0", true},             {"disable_corrector", nlohmann::json::array()}, {"solver_p", nullptr},
      {"use_flow_sigmas", false},       {"lower_order_final", true}};
  for (const auto& [key, value] : computed) {
    if (!json.contains(key) || json[key].is_null() || json[key] == value) continue;
    if (key == "variance_type" && s.sampler != SamplerKind::kDdpm) continue;  // another class's key, unused here
    fail(where + ": " + key + " = " + json[key].dump() + " is not supported (Kuafu's samplers compute " + value.dump() + ")");
  }
  return s;
}

Pipeline load_pipeline(const std::string& dir, const torch::Device& device, const PipelineLoad& how) {
  const fs::path root = dir;
  const nlohmann::json index = io::read_json_object((root / "model_index.json").string());
  // The classes Kuafu's components compute; a folder naming another class holds another model (the
  // scheduler's class is read with its config).
  const std::map<std::string, std::vector<std::string>> classes = {{"tokenizer", {"CLIPTokenizer", "CLIPTokenizerFast"}},
                                                                   {"text_encoder", {"CLIPTextModel"}},
                                                                   {"tokenizer_2", {"CLIPTokenizer", "CLIPTokenizerFast"}},
                                                                   {"text_encoder_2", {"CLIPTextModelWithProjection"}},
                                                                   {"unet", {"UNet2DConditionModel"}},
                                                                   {"vae", {"AutoencoderKL"}}};
  for (const auto& [name, value] : index.items()) {
    if (name.rfind('_', 0) == 0) continue;  // _class_name, _diffusers_version
    if (name == "force_zeros_for_empty_prompt") continue;  // SDXL's, read below
    if (name == "requires_aesthetics_score") {  // SDXL's img2img and inpainting classes; true in the refiner's folder
      KUAFU_CHECK(!value.is_boolean() || !value.get<bool>(), (root / "model_index.json").string(),
                  ": requires_aesthetics_score = true (SDXL's refiner: an aesthetic score in place of the target size among the time "
                  "ids) is not built; Kuafu samples and trains SDXL base-style folders");
      continue;
    }
    if (const auto known = classes.find(name); known != classes.end()) {
      const std::string named = value.is_array() && value.size() == 2 && value[1].is_string() ? value[1].get<std::string>() : "";
      const std::vector<std::string>& computed = known->second;
      KUAFU_CHECK(named.empty() || std::find(computed.begin(), computed.end(), named) != computed.end(),
                  (root / "model_index.json").string(), ": ", name, " is a ", named, ", which Kuafu does not compute (it reads ",
                  text::join(computed, " or "), ")");
      continue;
    }
    if (name == "scheduler") continue;
    const bool unused = name == "safety_checker" || name == "feature_extractor" || name == "image_encoder" || name == "requires_safety_checker";
    KUAFU_CHECK(unused, (root / "model_index.json").string(), ": component \"", name, "\" (", value.dump(),
                ") is not one Kuafu's pipeline has (tokenizer, text_encoder, unet, vae, scheduler; SDXL's tokenizer_2, text_encoder_2)");
    if (names_component(value)) {
      log::warnf((root / "model_index.json").string(), ": ", name, " skipped (not needed to sample)");
    }
  }
  Pipeline p;
  p.tokenizer = PromptTokenizer::from_folder((root / "tokenizer").string());
  p.text_encoder = clip_text_format().load((root / "text_encoder").string(), device, how.text_encoder);
  const bool sdxl = index.contains("text_encoder_2") && names_component(index["text_encoder_2"]);
  if (sdxl) {
    p.tokenizer_2 = PromptTokenizer::from_folder((root / "tokenizer_2").string());
    p.text_encoder_2 = clip_text_format().load((root / "text_encoder_2").string(), device, how.text_encoder);
    KUAFU_CHECK(p.text_encoder_2->config.with_projection, (root / "text_encoder_2" / "config.json").string(),
                ": SDXL's second text encoder must be a CLIPTextModelWithProjection (its pooled output is projected)");
    p.force_zeros_for_empty_prompt = io::config_value<bool>(index, "force_zeros_for_empty_prompt", true, (root / "model_index.json").string());
  }
  const std::string unet = (root / "unet").string();
  p.unet = how.describe_unet ? UNet2DCondition(read_unet_config(io::read_hf_config(unet), unet + "/config.json"), torch::kMeta)
                             : load_unet(unet, device, how.unet);
  p.vae = load_vae((root / "vae").string(), device, how.vae);
  p.scheduler = read_scheduler_config(io::read_json_object((root / "scheduler" / "scheduler_config.json").string()),
                                      (root / "scheduler" / "scheduler_config.json").string());
  const int64_t text_width = p.text_encoder->config.hidden_size + (sdxl ? p.text_encoder_2->config.hidden_size : 0);
  KUAFU_CHECK(text_width == p.unet->config.cross_attention_dim, dir, ": the text encoder", sdxl ? "s' widths (" : "'s width (", text_width,
              ") is not the UNet's cross_attention_dim (", p.unet->config.cross_attention_dim, ")");
  KUAFU_CHECK(sdxl == p.unet->config.text_time(), dir, ": ",
              sdxl ? "an SDXL pipeline (text_encoder_2) needs a UNet with addition_embed_type \"text_time\""
                   : "a UNet with addition_embed_type \"text_time\" (SDXL's) needs text_encoder_2 and tokenizer_2");
  for (torch::nn::Module* m : {static_cast<torch::nn::Module*>(p.text_encoder.get()), static_cast<torch::nn::Module*>(p.unet.get()),
                               static_cast<torch::nn::Module*>(p.vae.get())}) {
    m->eval();
  }
  if (sdxl) p.text_encoder_2->eval();
  return p;
}

void write_pipeline(const std::string& source, const std::string& out, const std::vector<PipelineComponent>& replaced) {
  KUAFU_CHECK(source.empty() || fs::exists(fs::path(source) / "model_index.json"), source,
              " is not a diffusers pipeline folder (no model_index.json)");
  auto is_replaced = [&](const fs::path& name) {
    return std::any_of(replaced.begin(), replaced.end(), [&](const PipelineComponent& c) { return c.name == name.string(); });
  };
  try {
    write_folder_atomic(out, [&](const fs::path& building) {
      if (!source.empty()) {
        for (const fs::directory_entry& entry : fs::directory_iterator(source)) {
          if (!is_replaced(entry.path().filename())) fs::copy(entry.path(), building / entry.path().filename(), fs::copy_options::recursive);
        }
      }
      for (const PipelineComponent& component : replaced) component.write((building / component.name).string());
    });
  } catch (const std::exception& e) {
    fail("cannot write the pipeline folder " + out + ": " + e.what());
  }
}

PromptEmbeddings encode_prompts(Pipeline& p, const std::vector<std::string>& texts) {
  const torch::Device device = p.text_encoder->parameters().front().device();
  const torch::Tensor ids = p.tokenizer.encode(texts).to(device);  // [N, M]
  if (!p.sdxl()) return {p.text_encoder->forward(ids, p.added_token_rows).last_hidden, {}};
  // SDXL: each encoder's penultimate hidden states, side by side in the second's dtype, and its projected pooled output.
  const torch::Tensor first = p.text_encoder->forward(ids, p.added_token_rows).penultimate;  // [N, M, D1]
  const ClipTextModelImpl::Output second = p.text_encoder_2->forward(p.tokenizer_2.encode(texts).to(device), p.added_token_rows_2);
  return {torch::cat({first.to(second.penultimate.scalar_type()), second.penultimate}, -1), second.text_embeds};
}

torch::Tensor sdxl_time_ids(int64_t rows, int64_t height, int64_t width, const torch::TensorOptions& options) {
  const auto h = static_cast<double>(height), w = static_cast<double>(width);
  return torch::tensor({h, w, 0.0, 0.0, h, w}, options).expand({rows, 6});
}

torch::Tensor denoise(UNet2DCondition& unet, Sampler& sampler, torch::Tensor latents, const torch::Tensor& text, double guidance,
                      at::Generator& generator, double guidance_rescale, const Inpainting& inpainting, const AddedConditions& added) {
  torch::NoGradGuard no_grad;
  const bool guided = needs_unconditional(guidance);
  const int64_t rows = latents.size(0);
  const torch::Dtype dtype = unet->conv_in->weight.scalar_type();
  const torch::Tensor context = text.to(dtype);
  for (size_t i = sampler.first_step(); i < sampler.timesteps().size(); ++i) {
    const torch::Tensor input = sampler.scale_model_input(latents, i);
    const torch::Tensor t = torch::full({guided ? 2 * rows : rows}, sampler.timesteps()[i], torch::TensorOptions(torch::kFloat32).device(latents.device()));
    torch::Tensor model_input = guided ? torch::cat({input, input}) : input;  // [(2)B, C, h, w]
    if (inpainting.condition.defined()) model_input = torch::cat({model_input, inpainting.condition}, 1);
    const torch::Tensor out = unet->forward(model_input.to(dtype), t, context, added).to(torch::kFloat32);
    torch::Tensor prediction = out;
    if (guided) {
      const torch::Tensor conditional = out.narrow(0, rows, rows);
      prediction = rescale_guidance(classifier_free_guidance(out.narrow(0, 0, rows), conditional, guidance), conditional,
                                    guidance_rescale);
    }
    torch::Tensor noise;
    if (sampler.stochastic()) noise = torch::randn(latents.sizes(), generator, torch::kFloat32).to(latents.device());
    latents = sampler.step(prediction, i, latents, noise);
    if (inpainting.blend) latents = inpainting.blend(latents, i);
  }
  return latents;
}

Samples sample(Pipeline& p, const std::vector<std::string>& given_prompts, const SampleOptions& options) {
  torch::NoGradGuard no_grad;
  KUAFU_CHECK(!given_prompts.empty(), "no prompt to sample");
  KUAFU_CHECK(options.images_per_prompt >= 1, "images per prompt must be at least 1, got ", options.images_per_prompt);
  const std::vector<std::string>& negative = options.negative_prompts;
  KUAFU_CHECK(negative.size() <= 1 || negative.size() == given_prompts.size(), negative.size(), " negative prompts for ",
              given_prompts.size(), " prompts: give one for all, or one for each");
  // Each prompt (and its negative prompt) once per image, its images next to each other, as diffusers repeats them.
  std::vector<std::string> prompts, negatives;
  for (size_t i = 0; i < given_prompts.size(); ++i) {
    for (int64_t n = 0; n < options.images_per_prompt; ++n) {
      prompts.push_back(given_prompts[i]);
      negatives.push_back(negative.empty() ? "" : negative[negative.size() == 1 ? 0 : i]);
    }
  }
  const auto rows = static_cast<int64_t>(prompts.size());
  const std::optional<SamplerKind> kind = options.sampler ? options.sampler : p.scheduler.sampler;
  KUAFU_CHECK(kind, "the pipeline's scheduler ", p.scheduler.class_name, " is not one Kuafu steps: name a sampler (ddim, ddpm, euler, euler_a, heun, dpm++2m, unipc)");
  SchedulerConfig config = p.scheduler.config_for(*kind);
  if (options.karras_sigmas) {
    KUAFU_CHECK(!*options.karras_sigmas || takes_karras_sigmas(*kind), "Karras sigmas are Euler's, Heun's, DPM-Solver++(2M)'s and UniPC's (euler, "
                "heun, dpm++2m, unipc): the sampler is another");
    config.karras_sigmas = *options.karras_sigmas;
  }
  const NoiseSchedule schedule(config);
  const std::unique_ptr<Sampler> sampler = make_sampler(*kind, schedule, options.steps, options.eta);
  const torch::Device device = p.unet->conv_in->weight.device();

  // Text: the prompts, and for guidance the negative prompts (else the empty one), as [unconditional;
  // conditional] rows.
  const bool guided = needs_unconditional(options.guidance);
  std::vector<std::string> texts;
  // SDXL without a negative prompt guides from zeros (diffusers' force_zeros_for_empty_prompt).
  const bool zero_negatives = guided && p.sdxl() && negative.empty() && p.force_zeros_for_empty_prompt;
  if (guided && !zero_negatives) texts = negatives;
  texts.insert(texts.end(), prompts.begin(), prompts.end());
  PromptEmbeddings embedded = encode_prompts(p, texts);  // [(2)B, 77, D], SDXL's pooled [(2)B, P]
  if (zero_negatives) {
    embedded.text = torch::cat({torch::zeros_like(embedded.text), embedded.text});
    embedded.pooled = torch::cat({torch::zeros_like(embedded.pooled), embedded.pooled});
  }
  const torch::Tensor& text = embedded.text;

  at::Generator generator = at::detail::createCPUGenerator(options.seed);
  torch::Tensor initial = options.initial_latents;
  const torch::Tensor& image = options.init_image;
  const torch::Tensor& mask = options.mask_image;
  const int64_t latent_channels = p.vae->config.latent_channels;
  const bool inpainting_unet = p.unet->config.in_channels == 2 * latent_channels + 1;
  KUAFU_CHECK(!mask.defined() || image.defined(), "a mask to inpaint needs the image it repaints");
  KUAFU_CHECK(!mask.defined() || inpainting_unet || p.unet->config.in_channels == latent_channels, "inpainting needs a UNet of ",
              2 * latent_channels + 1, " input channels (the latents, the mask and the masked image's latents) or of ", latent_channels,
              " (the known part put back after each step); this one takes ", p.unet->config.in_channels);
  KUAFU_CHECK(mask.defined() || !inpainting_unet, "this UNet inpaints (in_channels ", p.unet->config.in_channels,
              "): give an image and a mask to repaint");
  int64_t latent_h = 0, latent_w = 0;
  if (image.defined()) {
    KUAFU_CHECK(!initial.defined(), "img2img starts from an image's latents: give an image or initial latents, not both");
    KUAFU_CHECK(image.dim() == 4 && (image.size(0) == 1 || image.size(0) == rows) && image.size(1) == 3, "an img2img image of shape ",
                image.sizes(), " is not [1 or ", rows, ", 3, H, W]");
    const int64_t scale = p.vae_scale();
    KUAFU_CHECK(image.size(2) % scale == 0 && image.size(3) % scale == 0, "the img2img image's size (", image.size(3), "x", image.size(2),
                ") must divide by the VAE's factor ", scale, ": crop or resize it");
    latent_h = image.size(2) / scale;
    latent_w = image.size(3) / scale;
    // After the image's own checks, which its sizes here rely on.
    KUAFU_CHECK(!mask.defined() || (mask.dim() == 4 && (mask.size(0) == 1 || mask.size(0) == rows) && mask.size(1) == 1 &&
                                    mask.size(2) == image.size(2) && mask.size(3) == image.size(3)),
                "an inpainting mask of shape ", mask.sizes(), " is not [1 or ", rows, ", 1, H, W] at the image's size (", image.size(3), "x",
                image.size(2), ")");
  } else if (initial.defined()) {
    KUAFU_CHECK(initial.dim() == 4 && initial.size(0) == rows && initial.size(1) == p.unet->config.in_channels,
                "initial latents of shape ", initial.sizes(), " are not [", rows, ", ", p.unet->config.in_channels, ", h, w]");
    latent_h = initial.size(2);
    latent_w = initial.size(3);
  } else {
    const int64_t scale = p.vae_scale();
    const int64_t h = options.height > 0 ? options.height : p.unet->config.sample_size * scale;
    const int64_t w = options.width > 0 ? options.width : p.unet->config.sample_size * scale;
    KUAFU_CHECK(h % scale == 0 && w % scale == 0, "the image's size (", h, "x", w, ") must divide by the VAE's factor ", scale);
    latent_h = h / scale;
    latent_w = w / scale;
  }
  // Checked before the noise is drawn: a request for a huge image would fail to allocate it.
  check_sampling_fits(p, rows, latent_h, latent_w, guided, options.vae_tile, options.steps, device);
  // The VAE runs in float32 whatever its weights' dtype (see sample() in pipeline.h): a copy made when first needed.
  AutoencoderKL float32_vae{nullptr};
  const auto vae = [&]() -> AutoencoderKLImpl& {
    if (float32_vae.is_empty())
      float32_vae = p.vae->decoder->conv_in->weight.scalar_type() == torch::kFloat32 ? p.vae : float32_copy(p.vae, device);
    return *float32_vae;
  };
  torch::Tensor start;  // [B, C, h, w] what the loop starts from
  Inpainting inpainting;
  // An image's latents (`scaled`: its pixels in [−1, 1]): a sample of the VAE's latent distribution (one draw from the
  // generator), [B, C, h, w].
  const torch::Tensor pixels = image.defined() ? image.to(device, torch::kFloat32) * 2 - 1 : torch::Tensor();  // [1 or B, 3, H, W]
  const auto image_latents = [&](const torch::Tensor& scaled) {
    const AutoencoderKLImpl::Posterior posterior = vae().encode(scaled);
    const torch::Tensor drawn = torch::randn(posterior.mean.sizes(), generator, torch::kFloat32).to(device);
    const torch::Tensor latents = posterior.sample(drawn) * vae().config.scaling_factor;
    return latents.size(0) == rows ? latents : latents.expand({rows, -1, -1, -1});
  };
  if (mask.defined()) {
    // diffusers' order of draws: the image's latents (for an inpainting UNet below strength 1 only), the noise, the
    // masked image's latents (drawn for a plain UNet too, which does not read them).
    const size_t first = img2img_first_step(*sampler, options.steps, options.strength);
    const bool from_noise = options.strength == 1.0;
    const torch::Tensor clean = from_noise && inpainting_unet ? torch::Tensor() : image_latents(pixels);  // [B, C, h, w]
    initial = torch::randn({rows, latent_channels, latent_h, latent_w}, generator, torch::kFloat32);
    const torch::Tensor noise = initial.to(device);
    sampler->begin_at(first);
    start = from_noise ? noise * sampler->init_noise_sigma() : sampler->add_noise(clean, noise, first);
    const torch::Tensor repaint = (mask.to(device, torch::kFloat32) >= 0.5).to(torch::kFloat32);  // [1 or B, 1, H, W]
    const torch::Tensor masked_latents = image_latents(pixels * (1 - repaint));  // the repainted part blanked: [B, C, h, w]
    torch::Tensor small_mask = torch::nn::functional::interpolate(
        repaint, torch::nn::functional::InterpolateFuncOptions().size(std::vector<int64_t>{latent_h, latent_w}));  // nearest
    if (small_mask.size(0) != rows) small_mask = small_mask.expand({rows, -1, -1, -1});  // [B, 1, h, w]
    if (inpainting_unet) {
      inpainting.condition = torch::cat({small_mask, masked_latents}, 1);
      if (guided) inpainting.condition = torch::cat({inpainting.condition, inpainting.condition});
    } else {
      const size_t calls = sampler->timesteps().size();
      Sampler& s = *sampler;
      inpainting.blend = [&s, clean, noise, small_mask, calls](const torch::Tensor& latents, size_t i) {
        const torch::Tensor known = i + 1 < calls ? s.add_noise(clean, noise, i + 1) : clean;
        return (1 - small_mask) * known + small_mask * latents;
      };
    }
  } else if (image.defined()) {
    // diffusers' order of draws: the latent distribution's sample, then the noise added to it.
    const size_t first = img2img_first_step(*sampler, options.steps, options.strength);
    const torch::Tensor clean = image_latents(pixels);  // [B, C, h, w]
    initial = torch::randn(clean.sizes(), generator, torch::kFloat32);
    sampler->begin_at(first);
    start = sampler->add_noise(clean, initial.to(device), first);
  } else {
    if (!initial.defined()) initial = torch::randn({rows, p.unet->config.in_channels, latent_h, latent_w}, generator, torch::kFloat32);
    start = initial.to(device) * sampler->init_noise_sigma();
  }
  AddedConditions added;
  if (p.sdxl()) {
    added.text_embeds = embedded.pooled;
    added.time_ids = sdxl_time_ids(text.size(0), latent_h * p.vae_scale(), latent_w * p.vae_scale(), text.options());
  }
  const torch::Tensor latents =
      denoise(p.unet, *sampler, start, text, options.guidance, generator, options.guidance_rescale, inpainting, added);
  Samples samples{initial, latents, {}, text.narrow(0, guided ? rows : 0, rows), guided ? text.narrow(0, 0, rows) : torch::Tensor()};
  if (!options.decode) return samples;
  const torch::Tensor unscaled = latents / vae().config.scaling_factor;
  const torch::Tensor decoded = options.vae_tile > 0 ? vae().tiled_decode(unscaled, options.vae_tile) : vae().decode(unscaled);  // [B, 3, H, W] in about [−1, 1]
  samples.images = (decoded / 2 + 0.5).clamp(0, 1);
  return samples;
}

std::vector<std::pair<std::string, std::string>> sample_png_text(const std::vector<std::string>& prompts, const std::string& seed,
                                                                 const SampleOptions& options) {
  std::ostringstream guidance;
  guidance << options.guidance;
  std::vector<std::pair<std::string, std::string>> chunks = {
      {"prompt", text::join(prompts, " | ")}, {"seed", seed}, {"steps", std::to_string(options.steps)}, {"guidance", guidance.str()}};
  if (!options.negative_prompts.empty()) chunks.emplace_back("negative prompt", text::join(options.negative_prompts, " | "));
  const auto add_number = [&](const char* key, double value) {
    std::ostringstream text;
    text << value;
    chunks.emplace_back(key, text.str());
  };
  if (options.guidance_rescale != 0.0) add_number("guidance rescale", options.guidance_rescale);
  if (options.eta != 0.0) add_number("eta", options.eta);
  if (options.karras_sigmas) chunks.emplace_back("karras sigmas", *options.karras_sigmas ? "true" : "false");
  if (options.images_per_prompt != 1) chunks.emplace_back("images per prompt", std::to_string(options.images_per_prompt));
  if (options.init_image.defined()) add_number("strength", options.strength);
  return chunks;
}

io::RgbImage sample_grid(const torch::Tensor& images, int64_t columns) {
  torch::Tensor bytes = (images.to(torch::kCPU, torch::kFloat32) * 255).round().clamp(0, 255).to(torch::kUInt8);  // [B, C, H, W]
  if (bytes.size(1) == 1) bytes = bytes.expand({-1, 3, -1, -1});  // grey as RGB: [B, 3, H, W]
  const int64_t count = bytes.size(0), h = bytes.size(2), w = bytes.size(3);
  if (columns <= 0) columns = count;
  KUAFU_CHECK(count % columns == 0, "a grid of ", columns, " columns cannot hold ", count, " images");
  const torch::Tensor rows = bytes.view({count / columns, columns, 3, h, w})  // [R, K, 3, H, W]
                                 .permute({0, 3, 1, 4, 2})                   // [R, H, K, W, 3]
                                 .reshape({count / columns * h, columns * w, 3})
                                 .contiguous();  // [R·H, K·W, 3]
  io::RgbImage grid;
  grid.height = rows.size(0);
  grid.width = rows.size(1);
  grid.pixels.assign(rows.data_ptr<uint8_t>(), rows.data_ptr<uint8_t>() + rows.numel());
  return grid;
}

}  // namespace kuafu::sd
