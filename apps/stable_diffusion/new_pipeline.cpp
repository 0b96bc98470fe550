#include "apps/stable_diffusion/new_pipeline.h"

#include <nlohmann/json.hpp>

#include "apps/stable_diffusion/clip_hugging_face.h"
#include "apps/stable_diffusion/pipeline.h"
#include "apps/stable_diffusion/unet_folder.h"
#include "apps/stable_diffusion/vae_folder.h"
#include "core/io/bpe_tokenizer.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"

namespace kuafu::sd {

void add_init_schema(config::Schema& s) {
  s.add_int("init.text_hidden_size", 64, "init: the CLIP text encoder's width (the UNet's cross-attention width)").min(1);
  s.add_int("init.text_layers", 2, "init: the text encoder's transformer blocks").min(1);
  s.add_int("init.text_heads", 2, "init: the text encoder's attention heads").min(1);
  s.add_int("init.image_channels", 3, "init: the images' channels (3: RGB, 1: gray)").min(1).max(4);
  s.add_int_list("init.vae_block_out_channels", {32, 64}, "init: the VAE's widths (each block but the last halves the side)");
  s.add_int("init.vae_layers_per_block", 1, "init: ResNet blocks per VAE block").min(1);
  s.add_int("init.latent_channels", 4, "init: the latents' channels").min(1);
  s.add_int_list("init.unet_block_out_channels", {64, 128}, "init: the UNet's widths");
  s.add_int("init.unet_layers_per_block", 1, "init: ResNet blocks per UNet down block").min(1);
  s.add_int("init.unet_heads", 4, "init: attention heads in each UNet block").min(1);
  s.add_int("init.sample_size", 16, "init: the latents' side (images are sample_size × the VAE's factor pixels)").min(1);
  s.add_int("init.norm_num_groups", 8, "init: GroupNorm groups of the VAE and the UNet").min(1);
  s.add_string("init.prediction_type", "epsilon", "init: what the UNet learns to predict: epsilon, v_prediction or sample")
      .choices({"epsilon", "v_prediction", "sample"});
}

NewPipelineShape new_pipeline_shape(const config::Config& config) {
  NewPipelineShape s;
  s.text.vocab_size = 514;  // write_clip_characters' vocabulary
  s.text.hidden_size = config.get_int("init.text_hidden_size");
  s.text.intermediate_size = 4 * s.text.hidden_size;
  s.text.num_hidden_layers = config.get_int("init.text_layers");
  s.text.num_attention_heads = config.get_int("init.text_heads");
  s.text.eos_token_id = 513;  // <|endoftext|>: pooled at the first one
  const int64_t groups = config.get_int("init.norm_num_groups");
  s.vae.in_channels = s.vae.out_channels = config.get_int("init.image_channels");
  s.vae.latent_channels = config.get_int("init.latent_channels");
  s.vae.block_out_channels = config.get_int_list("init.vae_block_out_channels");
  s.vae.layers_per_block = config.get_int("init.vae_layers_per_block");
  s.vae.norm_num_groups = groups;
  s.vae.scaling_factor = 1.0;  // set by the VAE's training from its latents
  UNetConfig& u = s.unet;
  u.in_channels = u.out_channels = s.vae.latent_channels;
  u.block_out_channels = config.get_int_list("init.unet_block_out_channels");
  const size_t n = u.block_out_channels.size();
  u.down_block_types.assign(n, "CrossAttnDownBlock2D");
  u.up_block_types.assign(n, "CrossAttnUpBlock2D");
  u.down_block_types.back() = "DownBlock2D";
  u.up_block_types.front() = "UpBlock2D";
  u.layers_per_block = config.get_int("init.unet_layers_per_block");
  u.norm_num_groups = groups;
  u.cross_attention_dim = s.text.hidden_size;
  u.heads.assign(n, config.get_int("init.unet_heads"));
  u.sample_size = config.get_int("init.sample_size");
  s.vae.sample_size = u.sample_size * s.vae.scale_factor();  // the images' side
  s.scheduler.beta_start = 0.00085;
  s.scheduler.beta_end = 0.012;
  s.scheduler.beta_schedule = BetaSchedule::kScaledLinear;
  s.scheduler.steps_offset = 1;
  s.scheduler.set_alpha_to_one = false;
  s.scheduler.clip_sample = false;
  s.scheduler.prediction_type = prediction_named(config.get_string("init.prediction_type"));
  auto checked = [&](const std::string& key, const std::function<void()>& validate) {
    try {
      validate();
    } catch (const Error& e) {
      config.fail_at(key, e.what());
    }
  };
  checked("init.text_heads", [&] { s.text.validate(); });
  checked("init.vae_block_out_channels", [&] { s.vae.validate(); });
  checked("init.unet_block_out_channels", [&] { s.unet.validate(); });
  return s;
}

void write_new_pipeline(const NewPipelineShape& shape, const std::string& out, uint64_t seed) {
  torch::manual_seed(seed);
  ClipTextModel text(shape.text);
  AutoencoderKL vae(shape.vae);
  UNet2DCondition unet(shape.unet);
  const nlohmann::ordered_json index = {{"_class_name", "StableDiffusionPipeline"},
                                        {"feature_extractor", {nullptr, nullptr}},
                                        {"requires_safety_checker", false},
                                        {"safety_checker", {nullptr, nullptr}},
                                        {"scheduler", {"diffusers", "DDIMScheduler"}},
                                        {"text_encoder", {"transformers", "CLIPTextModel"}},
                                        {"tokenizer", {"transformers", "CLIPTokenizer"}},
                                        {"unet", {"diffusers", "UNet2DConditionModel"}},
                                        {"vae", {"diffusers", "AutoencoderKL"}}};
  const SchedulerConfig& c = shape.scheduler;
  const char* prediction = c.prediction_type == Prediction::kEpsilon ? "epsilon" : c.prediction_type == Prediction::kVPrediction ? "v_prediction" : "sample";
  const nlohmann::ordered_json scheduler = {{"_class_name", "DDIMScheduler"},  {"num_train_timesteps", c.num_train_timesteps},
                                            {"beta_start", c.beta_start},      {"beta_end", c.beta_end},
                                            {"beta_schedule", "scaled_linear"}, {"timestep_spacing", "leading"},
                                            {"steps_offset", c.steps_offset},  {"set_alpha_to_one", c.set_alpha_to_one},
                                            {"clip_sample", c.clip_sample},    {"prediction_type", prediction}};
  write_pipeline("", out,
                 {{"model_index.json", [&](const std::string& path) { write_file_atomic(path, index.dump(2)); }},
                  {"scheduler", [&](const std::string& dir) {
                     std::filesystem::create_directories(dir);
                     write_file_atomic(dir + "/scheduler_config.json", scheduler.dump(2));
                   }},
                  {"tokenizer", [](const std::string& dir) { io::BpeTokenizer::write_clip_characters(dir); }},
                  {"text_encoder", [&](const std::string& dir) { clip_text_format().save(text, dir); }},
                  {"vae", [&](const std::string& dir) { save_vae(vae, dir); }},
                  {"unet", [&](const std::string& dir) { save_unet(unet, dir); }}});
}

}  // namespace kuafu::sd
