#include "apps/stable_diffusion/commands.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <iostream>
#include <sstream>

#include "apps/stable_diffusion/class_images.h"
#include "apps/stable_diffusion/clip_hugging_face.h"
#include "apps/stable_diffusion/emoji_recipe.h"
#include "apps/stable_diffusion/new_pipeline.h"
#include "apps/stable_diffusion/textual_inversion.h"
#include "apps/stable_diffusion/unet_folder.h"
#include "apps/stable_diffusion/vae_folder.h"
#include "apps/stable_diffusion/vae_training.h"
#include "core/optim/mixed_precision.h"
#include "core/train/frozen_model.h"
#include "core/train/held_model.h"
#include "core/train/hf_interop.h"
#include "core/train/model_app.h"
#include "core/train/parallelize.h"
#include "core/train/peft_adapter.h"
#include "core/util/device.h"
#include "core/util/error.h"

namespace kuafu::sd {

namespace {

// The benchmarks' text encodings: as many positions as CLIP's prompts (77 tokens).
constexpr int64_t kTextTokens = 77;

class SdApp : public train::ModelApp<UNet2DCondition> {
 public:
  explicit SdApp(const config::Config& config) : ModelApp(config), settings_(read_sd_settings(config)) {
    unet_config_ = read_unet_config(io::read_hf_config(unet_folder()), unet_folder() + "/config.json");
  }

  // A run's: the UNet as its recipe counts it, and the frozen text encoder and VAE, each in its own
  // section's dtype. (Export, sampling and the benchmark make the UNet alone.)
  train::ModelSize model_size() override {
    const auto clip_parameters = [this](const std::string& name) {
      const std::string folder = component_folder(name);
      return static_cast<double>(clip_text_format().read_config(io::read_hf_config(folder), folder + "/config.json").parameter_count());
    };
    double text_parameters = clip_parameters("text_encoder");
    // SDXL's second encoder, in the text_encoder section's dtype as the pipeline loads it.
    if (std::filesystem::exists(component_folder("text_encoder_2") + "/config.json")) text_parameters += clip_parameters("text_encoder_2");
    const train::SizedModel frozen_text_encoder{"text_encoder", text_parameters, 0, /*trained=*/false, {"model.pipeline"}};
    train::ModelRecipe<AutoencoderKL> vae = vae_folder_recipe(component_folder("vae"), "vae");
    vae.size_keys = {"model.pipeline"};
    return train::size_of({train::sized(recipe()), frozen_text_encoder, train::sized(vae)});
  }

  std::unique_ptr<train::RunTask> make_task(const parallel::ModelOptions& options, const train::Runtime* runtime) override {
    train::require_data_parallel(config_, runtime, options, "kuafu-sd");
    // The frozen text encoder and VAE are read straight into the dtype they run in; the UNet is made as
    // its training holds it (an evaluation's, without a runtime, whole in float32).
    // (A text encoder with LoRA trains: float32 as the UNet, its compute dtype the trainer's.)
    const PipelineLoad how{settings_.text_encoder_lora ? torch::kFloat32 : train::FrozenModel::dtype_of(config_, "text_encoder", options.device),
                           torch::kFloat32, train::FrozenModel::dtype_of(config_, "vae", options.device), /*describe_unet=*/true};
    Pipeline pipeline = load_pipeline(settings_.pipeline, options.device, how);
    train::Built<UNet2DCondition> unet =
        train::build(recipe(), config_, {runtime ? train::Purpose::train : train::Purpose::evaluate, options});
    pipeline.unet = unet.model;
    if (runtime) train::checkpoint_from_config(config_, pipeline.unet->sites, kUNetCheckpointedBlocks);
    std::unique_ptr<DiffusionTask> task = make_diffusion_task(config_, settings_, std::move(pipeline), options.device);
    if (unet.deferred) task->defer_unet_weights(std::move(unet.deferred));
    if (settings_.dreambooth.prior_preservation()) task->preserve_prior(class_images(runtime, options.device, *task));
    if (settings_.text_encoder_lora) task->train_text_encoders(text_encoder_lora_spec(*train::lora_spec(config_)), settings_.train.seed + 1);
    return task;
  }

  std::string describe(train::RunTask& run_task) override {
    auto& task = dynamic_cast<DiffusionTask&>(run_task);
    const Pipeline& p = task.pipeline();
    const UNetConfig& u = p.unet->config;
    std::ostringstream line;
    line << "Stable Diffusion UNet (" << (settings_.new_unet ? "from scratch" : "from " + settings_.pipeline) << "): widths";
    for (const int64_t w : u.block_out_channels) line << ' ' << w;
    line << ", " << model_size().parameters / 1e6 << "M parameters, latents " << p.vae->config.latent_channels << "x" << u.sample_size
         << "x" << u.sample_size << " (" << u.sample_size * p.vae_scale() << " px); "
         << (p.sdxl() ? "SDXL: both text encoders and the VAE frozen; " : "text encoder and VAE frozen; ")
         << (task.buckets().empty() ? "" : std::to_string(task.buckets().size()) + " aspect-ratio buckets; ") << task.steps_per_epoch()
         << " steps per epoch";
    return line.str();
  }

  // Exports and samples take the moving average when the run keeps one.
  std::string model_part() const override { return config_.get_float("optim.ema_decay") > 0 ? "unet.ema" : "unet"; }

  // A whole pipeline folder (LoRA adapters merged into the UNet), or with --adapter the adapters alone.
  nlohmann::json export_model(const std::string& out, io::HfWriteOptions options, const config::ParsedCommand& command) override {
    const std::optional<nn::LoraSpec> lora = train::lora_spec(config_);
    // The text encoders' adapters (lora.text_encoder), read from the same checkpoint as the UNet.
    std::vector<std::pair<std::string, ClipTextModel>> encoders;
    if (settings_.text_encoder_lora) {
      const nn::LoraSpec spec = text_encoder_lora_spec(*lora);
      for (const std::string name : {"text_encoder", "text_encoder_2"}) {
        if (!std::filesystem::exists(component_folder(name) + "/config.json")) continue;
        ClipTextModel encoder = clip_text_format().load(component_folder(name));
        nn::apply_lora(*encoder, spec);
        train::load_checkpoint_weights(config_, command.option("checkpoint"), *encoder, name + (model_part() == "unet" ? "" : ".ema"));
        encoders.emplace_back(name, encoder);
      }
    }
    if (command.flag("adapter")) {
      KUAFU_CHECK(lora, "export --adapter writes LoRA adapters, but lora.rank = 0 in ", config_.path());
      std::vector<AdaptedTextEncoder> adapted;
      for (auto& [name, encoder] : encoders) adapted.push_back({name, encoder.get(), text_encoder_lora_spec(*lora)});
      export_unet_adapter(*model(), *lora, out, unet_folder(), adapted);
      return {{"adapter", true}, {"unet", model_part()}, {"text_encoders", encoders.size()}};
    }
    std::vector<PipelineComponent> replaced;
    for (auto& [name, encoder] : encoders) {
      ClipTextModel plain = clip_text_format().load(component_folder(name));
      train::copy_named_weights(nn::merged_lora_weights(*encoder, text_encoder_lora_spec(*lora)), *plain);
      replaced.push_back({name, [plain, options](const std::string& dir) mutable { save_clip_text_model(plain, dir, options); }});
    }
    UNet2DCondition unet = model();
    if (lora) {
      // The adapters folded into a plain UNet of the same description: the merged weights are its draws.
      const train::ModelRecipe<UNet2DCondition> merged{"", /*trained=*/false, recipe().describe, [&](UNet2DCondition& plain) {
        train::copy_named_weights(nn::merged_lora_weights(*model(), *lora), *plain);
      }};
      unet = train::build_as(merged, train::Materialization::all_in(torch::kCPU, torch::kFloat32));
    }
    replaced.push_back({"unet", [&](const std::string& dir) { save_unet(unet, dir, options); }});
    write_pipeline(settings_.pipeline, out, replaced);
    return {{"adapter", false}, {"unet", model_part()}, {"pipeline", settings_.pipeline}};
  }

  nlohmann::json benchmark(const train::Runtime& runtime, train::BenchmarkMemory& memory) override;
  nlohmann::json benchmark_sampling(const train::Runtime& runtime, train::BenchmarkMemory& memory);

 private:
  // The UNet with lora.*'s adapters (drawn from train.seed, so every run and rank starts from the same
  // ones), its weights the pipeline's unet/ folder's (unless model.new_unet) or PyTorch's draws from
  // train.seed. The folder's read gives every weight, so it replaces the draws.
  train::ModelRecipe<UNet2DCondition> recipe() const override {
    train::ModelRecipe<UNet2DCondition> recipe;
    recipe.name = "unet";
    recipe.describe = train::described_whole<UNet2DCondition>(unet_config_);
    recipe.draw = train::seeded_initialization<UNet2DCondition>(settings_.train.seed);
    if (!settings_.new_unet) {
      recipe.load = [folder = unet_folder()](UNet2DCondition& unet) { load_unet_weights(*unet, io::read_hf_folder(folder)); };
      recipe.load_gives_every_weight = true;
    }
    if (train::lora_spec(config_)) {
      recipe.adapt = [config = config_, seed = settings_.train.seed](UNet2DCondition& unet, std::optional<torch::Device> host_base) {
        torch::manual_seed(seed);
        train::apply_configured_lora(config, *unet, host_base);
      };
    }
    recipe.parameters = static_cast<double>(unet_config_.parameter_count());
    recipe.size_keys = {"model.pipeline"};
    return recipe;
  }
  // DreamBooth's class images at the training size, made first where the folder lacks some (by a run of one
  // process, or `kuafu-sd classes`: ranks would each make them).
  std::unique_ptr<io::ImageDataset> class_images(const train::Runtime* runtime, const torch::Device& device, DiffusionTask& task) const {
    const DreamBoothSettings& d = settings_.dreambooth;
    if (const int64_t have = count_class_images(d); have < d.class_images) {
      if (runtime && runtime->world->size() > 1) {
        config_.fail_at("dreambooth.class_data", d.class_data + " holds " + std::to_string(have) + " of the " +
                                                     std::to_string(d.class_images) +
                                                     " class images; make them first with `kuafu-sd classes` (one process)");
      }
      make_class_images(settings_, device);
    }
    const Pipeline& p = task.pipeline();
    return open_class_images(config_, p.vae->config.in_channels, p.unet->config.sample_size * p.vae_scale(), task.buckets());
  }
  std::string component_folder(const std::string& name) const { return (std::filesystem::path(settings_.pipeline) / name).string(); }
  std::string unet_folder() const { return component_folder("unet"); }

  SdSettings settings_;
  UNetConfig unet_config_;
};

namespace {

// An SDXL UNet's added conditions for `rows` random rows: a random pooled text and the time ids of its sample size in
// pixels (SDXL's VAE factor, 8); none for SD 1.x and 2.x.
AddedConditions benchmark_conditions(const UNetConfig& u, int64_t rows, const torch::TensorOptions& options) {
  if (!u.text_time()) return {};
  const int64_t pooled = u.projection_class_embeddings_input_dim - 6 * u.addition_time_embed_dim;
  KUAFU_CHECK(pooled > 0, "the UNet's projection_class_embeddings_input_dim leaves no pooled text beside 6 time ids");
  const int64_t pixels = 8 * u.sample_size;
  return {torch::randn({rows, pooled}, options), sdxl_time_ids(rows, pixels, pixels, options)};
}

}  // namespace

nlohmann::json SdApp::benchmark(const train::Runtime& runtime, train::BenchmarkMemory& memory) {
  if (config_.get_int("benchmark.sampling_steps") > 0) return benchmark_sampling(runtime, memory);
  train::checkpoint_from_config(config_, model()->sites, kUNetCheckpointedBlocks);
  const UNetConfig& u = unet_config_;
  const int64_t rows = settings_.train.micro_batch_size, side = u.sample_size, text_tokens = kTextTokens;
  const auto f32 = torch::TensorOptions().device(runtime.device);
  const torch::Tensor latents = torch::randn({rows, u.in_channels, side, side}, f32);
  const torch::Tensor noise = torch::randn({rows, u.in_channels, side, side}, f32);
  const torch::Tensor text = torch::randn({rows, text_tokens, u.cross_attention_dim}, f32);
  const torch::Tensor timesteps = torch::randint(1000, {rows}, f32.dtype(torch::kInt64));
  const AddedConditions added = benchmark_conditions(u, rows, f32);
  const NoiseSchedule schedule{SchedulerConfig{}};
  train::BenchmarkSpec spec;
  spec.app = "stable_diffusion";
  spec.item_name = "images";
  spec.flops_per_item = 3 * u.forward_flops(side, side, text_tokens);
  spec.parameters = unet_config_.parameter_count();
  spec.fields = {{"latent_size", side}, {"block_out_channels", u.block_out_channels}};
  spec.deferred = deferred();
  auto loss = [&] {
    const torch::Dtype dtype = model()->conv_in->weight.scalar_type();  // the compute dtype, once the state has cast it
    return diffusion_loss(model(), schedule, DiffusionInputs{latents, text.to(dtype), noise, timesteps, added});
  };
  return train::benchmark_training(config_, runtime, *model(), loss, rows, spec, memory);
}

// DDIM's loop under guidance 7.5 (two UNet rows per image, diffusers' default scale) on random initial
// latents and text encodings, the UNet alone in precision.dtype: what benchmarks/sd_sampling_diffusers.py
// times in diffusers.
nlohmann::json SdApp::benchmark_sampling(const train::Runtime& runtime, train::BenchmarkMemory& memory) {
  const train::HeldModel& held = train::held_model(config_, "unet");
  if (held.sharded()) {
    config_.model_view("unet").fail_at("memory.strategy", "must be \"none\" with benchmark.sampling_steps: sampling is timed on the UNet alone");
  }
  const torch::Dtype dtype = train::compute_dtype(config_, runtime.device, "unet");
  model()->to(dtype);
  model()->eval();
  const UNetConfig& u = unet_config_;
  const int64_t rows = settings_.train.micro_batch_size, steps = config_.get_int("benchmark.sampling_steps");
  const double guidance = 7.5;
  const auto f32 = torch::TensorOptions().device(runtime.device);
  const torch::Tensor initial = torch::randn({rows, u.in_channels, u.sample_size, u.sample_size}, f32);  // [B, C, h, w]
  const torch::Tensor text = torch::randn({2 * rows, kTextTokens, u.cross_attention_dim}, f32);           // [2B, 77, D]
  const AddedConditions added = benchmark_conditions(u, 2 * rows, f32);                                   // SDXL's
  const NoiseSchedule schedule{SchedulerConfig{}};
  at::Generator generator = at::detail::createCPUGenerator(0);
  memory.start_steps();
  const train::StepTimes times = train::time_steps(
      [&] {
        const std::unique_ptr<Sampler> ddim = make_sampler(SamplerKind::kDdim, schedule, steps);
        denoise(model(), *ddim, initial, text, guidance, generator, 0.0, {}, added);
      },
      config_.get_int("benchmark.warmup"), config_.get_int("benchmark.steps"), runtime.device);
  nlohmann::json line = {{"app", "stable_diffusion"},
                         {"config", config_.path()},
                         {"measures", "sampling"},
                         {"parameters", unet_config_.parameter_count()},
                         {"batch", rows},
                         {"precision", held.precision},
                         {"sampler", "ddim"},
                         {"sampling_steps", steps},
                         {"guidance", guidance},
                         {"latent_size", u.sample_size},
                         {"loop_s_median", times.median},
                         {"sampling_steps_per_s", static_cast<double>(steps) / times.median},
                         {"ms_per_sampling_step", times.median * 1e3 / static_cast<double>(steps)}};
  line.update(memory.figures());
  return line;
}

}  // namespace

std::unique_ptr<train::App> make_sd_app(const config::Config& config) {
  if (config.get_string("model.train") == "vae") return make_vae_app(config);
  if (config.get_string("model.train") == "textual_inversion") return make_textual_inversion_app(config);
  return std::make_unique<SdApp>(config);
}

int run_sd_app(int argc, const char* const argv[]) {
  train::AppDefinition app;
  app.program = "kuafu-sd";
  app.description = "Stable Diffusion: train or fine-tune a diffusers pipeline's UNet, evaluate, export, benchmark; "
                    "`kuafu-sd sample --help` samples images";
  app.schema = sd_schema();
  app.make_app = make_sd_app;
  app.before = {{"prepare", "write the data recipe's captioned image folders (data.train, data.val)",
                 [](const config::Config& config, const config::ParsedCommand&) {
                   const std::string train = config.get_string("data.train"), val = config.get_string("data.val");
                   if (train.empty()) config.fail_at("data.train", "is empty; name the folder prepare writes the training images to");
                   if (val.empty()) config.fail_at("data.val", "is empty; name the folder prepare writes the held-out images to");
                   const EmojiSplit split = write_emoji_folders(config.get_string("prepare.source"), train, val);
                   std::cout << nlohmann::json{{"train", split.train}, {"held_out", split.held_out}, {"toned_bases", split.toned_bases},
                                               {"unnamed_skipped", split.unnamed}}.dump() << std::endl;
                 }},
                {"classes", "make DreamBooth's class images (dreambooth.class_data) the folder lacks, with the pipeline itself",
                 [](const config::Config& config, const config::ParsedCommand&) {
                   const SdSettings settings = read_sd_settings(config);
                   if (!settings.dreambooth.prior_preservation()) config.fail_at("dreambooth.class_data", "is empty; name the folder to fill");
                   const int64_t made = make_class_images(settings, resolve_device(config.get_string("runtime.device"), 0));
                   std::cout << nlohmann::json{{"class_data", settings.dreambooth.class_data}, {"made", made},
                                               {"images", count_class_images(settings.dreambooth)}}.dump() << std::endl;
                 }},
                {"init", "write a new pipeline folder (--out DIR) to train from scratch, shaped by init.*",
                 [](const config::Config& config, const config::ParsedCommand& command) {
                   const std::string out = command.option("out");
                   KUAFU_CHECK(!out.empty(), "init needs --out DIR (a new folder)");
                   const NewPipelineShape shape = new_pipeline_shape(config);
                   write_new_pipeline(shape, out, static_cast<uint64_t>(config.get_int("train.seed")));
                   std::cout << nlohmann::json{{"pipeline", out}, {"unet_parameters", shape.unet.parameter_count()}}.dump() << std::endl;
                 }},
                {"finetune", "train, starting from the pipeline's UNet (as train does unless model.new_unet)",
                 [](const config::Config& config, const config::ParsedCommand&) {
                   if (config.get_bool("model.new_unet")) config.fail_at("model.new_unet", "= true trains from scratch; use `train`");
                   train::train_app(*make_sd_app(config), config);
                 }}};
  app.add_options = [](config::CommandLine& cli) {
    train::add_adapter_option(cli);
    cli.option("init", "out", "DIR", "", "the new pipeline folder");
  };
  app.item_help = "random latents and text encodings";
  app.export_help = "StableDiffusionPipeline.from_pretrained loads it; --adapter: the UNet's LoRA adapters for "
                    "load_lora_weights and PeftModel, and as kohya's kohya_lora.safetensors (ComfyUI, A1111)";
  app.eval_help = "the diffusion loss of a checkpoint's UNet on the evaluation images";
  return train::run_app(app, argc, argv);
}

}  // namespace kuafu::sd
