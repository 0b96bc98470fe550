#include "apps/stable_diffusion/textual_inversion.h"

#include <filesystem>
#include <sstream>

#include "apps/stable_diffusion/clip_hugging_face.h"
#include "apps/stable_diffusion/sd_settings.h"
#include "apps/stable_diffusion/textual_inversion_file.h"
#include "apps/stable_diffusion/train_task.h"
#include "apps/stable_diffusion/unet_folder.h"
#include "apps/stable_diffusion/vae_folder.h"
#include "core/io/hf_folder.h"
#include "core/train/frozen_model.h"
#include "core/train/held_model.h"
#include "core/train/model_app.h"
#include "core/train/parallelize.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"

namespace kuafu::sd {

namespace {

namespace fs = std::filesystem;

// The initializer word's embedding [D] in the text encoder of folder `encoder_dir`, as tokenizer `tokenizer_dir`
// reads the word (one token, as textual_inversion.py requires).
torch::Tensor initializer_row(const config::Config& config, const std::string& word, const fs::path& tokenizer_dir,
                              const fs::path& encoder_dir) {
  const std::vector<int64_t> ids = PromptTokenizer::from_folder(tokenizer_dir.string()).bpe().encode(word);
  if (ids.size() != 1) {
    config.fail_at("textual_inversion.initializer", "\"" + word + "\" is " + std::to_string(ids.size()) + " tokens for " +
                                                        tokenizer_dir.string() + "; name a word that is one token (e.g. \"cat\")");
  }
  const io::HfFolder folder = io::read_hf_folder(encoder_dir.string());
  // transformers 5 saves CLIP without the text_model level; earlier versions with it.
  const io::HfTensor* table = folder.find("text_model.embeddings.token_embedding.weight");
  if (!table) table = folder.find("embeddings.token_embedding.weight");
  KUAFU_CHECK(table, encoder_dir.string(), " has no (text_model.)embeddings.token_embedding.weight");
  return table->read().to(torch::kFloat32)[ids[0]].clone();
}

class TextualInversionApp : public train::ModelApp<LearnedTokens> {
 public:
  explicit TextualInversionApp(const config::Config& config) : ModelApp(config), settings_(read_sd_settings(config)) {
    const fs::path root = settings_.pipeline;
    const TextualInversionSettings& t = settings_.textual_inversion;
    initial_ = initializer_row(config, t.initializer, root / "tokenizer", root / "text_encoder");
    if (fs::exists(root / "text_encoder_2" / "config.json")) {
      initial_2_ = initializer_row(config, t.initializer, root / "tokenizer_2", root / "text_encoder_2");
    }
    if (train::held_model(config, "tokens").sharded()) {
      config.fail_at("memory.strategy", "must be \"none\" for textual inversion: its few trained rows are not worth sharding");
    }
  }

  // The concept's rows, and the pipeline's frozen UNet, text encoder(s) and VAE in their sections' dtypes.
  train::ModelSize model_size() override {
    const fs::path root = settings_.pipeline;
    const auto component = [&](const std::string& name, double parameters) {
      return train::SizedModel{name, parameters, 0, /*trained=*/false, {"model.pipeline"}};
    };
    const auto clip_parameters = [&](const std::string& name) {
      const std::string folder = (root / name).string();
      return static_cast<double>(clip_text_format().read_config(io::read_hf_config(folder), folder + "/config.json").parameter_count());
    };
    const std::string unet = (root / "unet").string();
    std::vector<train::SizedModel> models = {
        train::sized(recipe()),
        component("unet", static_cast<double>(read_unet_config(io::read_hf_config(unet), unet + "/config.json").parameter_count())),
        component("text_encoder", clip_parameters("text_encoder") + (initial_2_.defined() ? clip_parameters("text_encoder_2") : 0.0))};
    train::ModelRecipe<AutoencoderKL> vae = vae_folder_recipe((root / "vae").string(), "vae");
    vae.size_keys = {"model.pipeline"};
    models.push_back(train::sized(vae));
    return train::size_of(models);
  }

  std::unique_ptr<train::RunTask> make_task(const parallel::ModelOptions& options, const train::Runtime* runtime) override {
    train::require_data_parallel(config_, runtime, options, "kuafu-sd (textual inversion)");
    const PipelineLoad how{train::FrozenModel::dtype_of(config_, "text_encoder", options.device),
                           train::FrozenModel::dtype_of(config_, "unet", options.device),
                           train::FrozenModel::dtype_of(config_, "vae", options.device), /*describe_unet=*/false};
    Pipeline pipeline = load_pipeline(settings_.pipeline, options.device, how);
    // The frozen UNet's activations, which the backward to the text passes through.
    if (runtime) train::checkpoint_from_config(config_, pipeline.unet->sites, kUNetCheckpointedBlocks);
    train::Built<LearnedTokens> tokens =
        train::build(recipe(), config_, {runtime ? train::Purpose::train : train::Purpose::evaluate, options});
    const TextualInversionSettings& t = settings_.textual_inversion;
    try {
      add_concept(pipeline, t.token, tokens.model->rows.detach(), tokens.model->rows_2.defined() ? tokens.model->rows_2.detach() : torch::Tensor());
    } catch (const Error& e) {
      config_.fail_at("textual_inversion.token", e.what());
    }
    std::unique_ptr<DiffusionTask> task = make_diffusion_task(config_, settings_, std::move(pipeline), options.device);
    task->train_tokens(tokens.model, t.token, t.templates);
    return task;
  }

  std::string describe(train::RunTask& task) override {
    const TextualInversionSettings& t = settings_.textual_inversion;
    std::ostringstream line;
    line << "Textual inversion of " << t.token << " (" << t.vectors << " vector" << (t.vectors > 1 ? "s" : "") << " from \""
         << t.initializer << "\") into " << settings_.pipeline << ": everything else frozen, captions "
         << (t.image_captions ? "the images' own" : std::to_string(t.templates.size()) + " templates") << "; " << task.steps_per_epoch()
         << " steps per epoch";
    return line.str();
  }

  std::string model_part() const override { return config_.get_float("optim.ema_decay") > 0 ? "tokens.ema" : "tokens"; }

  // OUT/learned_embeds.safetensors (a new folder, never over an existing one).
  nlohmann::json export_model(const std::string& out, io::HfWriteOptions, const config::ParsedCommand&) override {
    const std::string& token = settings_.textual_inversion.token;
    const io::NamedTensors tensors = textual_inversion_tensors(token, model()->rows, model()->rows_2);
    write_folder_atomic(out, [&](const fs::path& building) {
      io::save_safetensors((building / kLearnedEmbedsFile).string(), tensors, {{"token", token}, {"pipeline", settings_.pipeline}});
    });
    return {{"token", token}, {"vectors", model()->rows.size(0)}, {"file", (fs::path(out) / kLearnedEmbedsFile).string()},
            {"tokens", model_part()}};
  }

  nlohmann::json benchmark(const train::Runtime&, train::BenchmarkMemory&) override {
    fail("kuafu-sd benchmark times the UNet's training; set model.train = \"unet\" in " + config_.path());
  }

 private:
  // The concept's rows, each vector the initializer word's embedding.
  train::ModelRecipe<LearnedTokens> recipe() const override {
    const int64_t vectors = settings_.textual_inversion.vectors, hidden = initial_.size(0);
    const int64_t hidden_2 = initial_2_.defined() ? initial_2_.size(0) : 0;
    train::ModelRecipe<LearnedTokens> recipe;
    recipe.name = "tokens";
    recipe.describe = [=](const parallel::ModelOptions&) { return LearnedTokens(vectors, hidden, hidden_2, torch::kMeta); };
    recipe.draw = [initial = initial_, initial_2 = initial_2_](LearnedTokens& tokens) {
      torch::NoGradGuard no_grad;
      tokens->rows.copy_(initial.expand_as(tokens->rows));
      if (initial_2.defined()) tokens->rows_2.copy_(initial_2.expand_as(tokens->rows_2));
    };
    recipe.parameters = static_cast<double>(vectors * (hidden + hidden_2));
    return recipe;
  }

  SdSettings settings_;
  torch::Tensor initial_, initial_2_;  // [D1], [D2] (SDXL)
};

}  // namespace

std::unique_ptr<train::App> make_textual_inversion_app(const config::Config& config) {
  return std::make_unique<TextualInversionApp>(config);
}

}  // namespace kuafu::sd
