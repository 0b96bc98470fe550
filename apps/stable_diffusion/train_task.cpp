#include "apps/stable_diffusion/train_task.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <numeric>

#include "core/nn/lora.h"
#include "core/util/error.h"
#include "core/util/logging.h"
#include "core/util/seed_mix.h"

namespace kuafu::sd {

namespace {

enum Stream : int64_t { kRowDraws = 1, kAugment = 2, kEvalDraws = 3, kClassDraws = 4, kClassItem = 5, kClassAugment = 6 };

// train_text_to_image_sdxl.py's time ids [rows, 6] (float, `options`): each image's original height and width, the
// top-left corner of its crop in the resized image, and the training size, `height` × `width` pixels (the square, or
// the rows' aspect bucket as kohya's sd-scripts give it).
torch::Tensor training_time_ids(const std::vector<io::ImagePlacement>& placements, int64_t height, int64_t width,
                                const torch::TensorOptions& options) {
  std::vector<double> ids;
  for (const io::ImagePlacement& p : placements) {
    ids.insert(ids.end(), {static_cast<double>(p.original_height), static_cast<double>(p.original_width), static_cast<double>(p.top),
                           static_cast<double>(p.left), static_cast<double>(height), static_cast<double>(width)});
  }
  return torch::tensor(ids, options.dtype(torch::kFloat64)).view({static_cast<int64_t>(placements.size()), 6}).to(options);
}

// `items` (those of a bucket, -1 left out) in chunks of at most `chunk`, each chunk's items of one bucket
// (`groups`: each item's), handed to `use` with their bucket.
void for_each_bucket_chunk(const std::vector<size_t>& items, const std::vector<int64_t>& groups, int64_t chunk,
                           const std::function<void(const std::vector<size_t>&, int64_t)>& use) {
  std::map<int64_t, std::vector<size_t>> by_group;
  std::vector<int64_t> order;  // the groups in order of first appearance
  for (const size_t item : items) {
    const int64_t group = groups.at(item);
    if (group < 0) continue;
    if (by_group[group].empty()) order.push_back(group);
    by_group[group].push_back(item);
  }
  chunk = std::max<int64_t>(1, chunk);
  for (const int64_t group : order) {
    const std::vector<size_t>& members = by_group[group];
    for (size_t first = 0; first < members.size(); first += static_cast<size_t>(chunk)) {
      use({members.begin() + static_cast<int64_t>(first), members.begin() + static_cast<int64_t>(std::min(members.size(), first + chunk))},
          group);
    }
  }
}

}  // namespace

torch::Tensor offset_noise(const torch::Tensor& noise, const torch::Tensor& draws, double amount) { return noise + amount * draws; }

RowDraws draw_row(uint64_t seed, int64_t step, int64_t row, const std::vector<int64_t>& latent_shape, int64_t train_timesteps,
                  const DiffusionSettings& settings) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(mix_seed(seed, step, row, kRowDraws));
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  RowDraws d;
  d.posterior_noise = torch::randn(latent_shape, generator, f32);
  d.noise = torch::randn(latent_shape, generator, f32);
  const torch::Tensor offset = torch::randn({latent_shape[0], 1, 1}, generator, f32);  // drawn whether used or not
  if (settings.noise_offset > 0) d.noise = offset_noise(d.noise, offset, settings.noise_offset);
  d.timestep = torch::randint(train_timesteps, {1}, generator, torch::TensorOptions().dtype(torch::kInt64)).item<int64_t>();
  d.drop_caption = torch::rand({1}, generator, f32).item<double>() < settings.caption_dropout;
  d.caption_choice = torch::randint(int64_t{1} << 31, {1}, generator, torch::TensorOptions().dtype(torch::kInt64)).item<int64_t>();
  return d;
}

DiffusionTask::DiffusionTask(Pipeline pipeline, SdSettings settings, std::unique_ptr<io::ImageDataset> train,
                             std::unique_ptr<io::ImageDataset> val, std::vector<io::ImageSize> buckets, const torch::Device& device)
    : pipeline_(std::move(pipeline)), settings_(std::move(settings)), schedule_(pipeline_.scheduler.config), train_(std::move(train)),
      val_(std::move(val)), buckets_(std::move(buckets)), device_(device) {
  const int64_t side = pipeline_.unet->config.sample_size;
  latent_shape_ = {pipeline_.vae->config.latent_channels, side, side};
  train_groups_ = groups_of(*train_);
  if (buckets_.empty()) {
    order_.emplace(train_->size(), settings_.train.batch_size, settings_.train.seed);
  } else {
    grouped_.emplace(train_groups_, settings_.train.batch_size, settings_.train.seed);
    std::map<int64_t, int64_t> counts;
    for (const int64_t group : train_groups_) counts[group] += group >= 0;
    std::string line;
    for (const auto& [group, count] : counts) {
      if (group < 0) continue;
      const io::ImageSize& bucket = buckets_[static_cast<size_t>(group)];
      line += " " + std::to_string(bucket.width) + "x" + std::to_string(bucket.height) + ": " + std::to_string(count);
    }
    log::infof("aspect-ratio buckets (width x height: training images):", line);
  }
  val_groups_ = groups_of(*val_);
  train::freeze(*pipeline_.text_encoder);
  if (pipeline_.sdxl()) train::freeze(*pipeline_.text_encoder_2);
  train::freeze(*pipeline_.vae);
}

std::vector<int64_t> DiffusionTask::groups_of(io::ImageDataset& set) const {
  if (buckets_.empty()) return std::vector<int64_t>(static_cast<size_t>(set.size()), 0);
  std::vector<int64_t> groups;
  for (const io::ImageSize& size : set.image_sizes()) {
    groups.push_back(size.height > 0 ? static_cast<int64_t>(io::nearest_bucket(buckets_, size)) : -1);
  }
  return groups;
}

std::vector<int64_t> DiffusionTask::latent_shape(int64_t group) const {
  if (buckets_.empty()) return latent_shape_;
  const io::ImageSize& bucket = buckets_.at(static_cast<size_t>(group));
  return {latent_shape_[0], bucket.height / pipeline_.vae_scale(), bucket.width / pipeline_.vae_scale()};
}

void DiffusionTask::preserve_prior(std::unique_ptr<io::ImageDataset> classes) {
  classes_ = std::move(classes);
  class_pools_.clear();
  const std::vector<int64_t> groups = groups_of(*classes_);
  for (size_t item = 0; item < groups.size(); ++item) {
    if (groups[item] < 0) continue;
    class_pools_[groups[item]].group = groups[item];
    class_pools_[groups[item]].items.push_back(item);
  }
  KUAFU_CHECK(!class_pools_.empty(), "DreamBooth: no class image could be read");
  const auto largest = std::max_element(class_pools_.begin(), class_pools_.end(),
                                        [](const auto& a, const auto& b) { return a.second.items.size() < b.second.items.size(); });
  class_pools_[-1] = largest->second;
}

const DiffusionTask::ClassPool& DiffusionTask::class_pool(int64_t group) const {
  const auto found = class_pools_.find(group);
  return found != class_pools_.end() ? found->second : class_pools_.at(-1);
}

void DiffusionTask::train_tokens(LearnedTokens tokens, const std::string& token, const std::vector<std::string>& templates) {
  tokens_ = std::move(tokens);
  token_ = token;
  train::freeze(*pipeline_.unet);
  concept_captions_.clear();
  for (const std::string& line : templates) concept_captions_.push_back(with_token(line));
}

std::string DiffusionTask::with_token(std::string caption) const {
  for (size_t at = caption.find("{}"); at != std::string::npos; at = caption.find("{}", at + token_.size())) caption.replace(at, 2, token_);
  return caption;
}

std::vector<std::string> DiffusionTask::graph_captions(const std::vector<RowDraws>& draws, const std::vector<std::string>& images) const {
  std::vector<std::string> captions;
  for (size_t i = 0; i < draws.size(); ++i) {
    if (draws[i].drop_caption) {
      captions.emplace_back();
    } else if (!tokens_) {
      captions.push_back(images.at(i));
    } else if (concept_captions_.empty()) {
      captions.push_back(with_token(images.at(i)));
    } else {
      captions.push_back(concept_captions_[static_cast<size_t>(draws[i].caption_choice) % concept_captions_.size()]);
    }
  }
  return captions;
}

void DiffusionTask::train_text_encoders(const nn::LoraSpec& spec, uint64_t seed) {
  torch::manual_seed(seed);
  nn::apply_lora(*pipeline_.text_encoder, spec);
  if (pipeline_.sdxl()) nn::apply_lora(*pipeline_.text_encoder_2, spec);
  text_encoder_lora_ = true;
}

std::vector<train::RunModel> DiffusionTask::models() {
  const auto trained = [](const std::string& name, torch::nn::Module& module) {
    train::RunModel model;
    model.name = name;
    model.module = &module;
    return model;
  };
  // Textual inversion trains its rows with the UNet frozen; text-encoder LoRA trains the encoders with the UNet.
  std::vector<train::RunModel> models;
  if (tokens_) {
    models = {trained("tokens", *tokens_), train::frozen_run_model("unet", *pipeline_.unet, pipeline_.unet.get())};
  } else {
    models = {train::trained_run_model("unet", *pipeline_.unet, unet_weights_)};
  }
  const auto text_encoder = [&](const std::string& name, ClipTextModel& encoder) {
    return text_encoder_lora_ ? trained(name, *encoder) : train::frozen_run_model(name, *encoder);
  };
  models.push_back(text_encoder("text_encoder", pipeline_.text_encoder));
  models.push_back(train::frozen_run_model("vae", *pipeline_.vae));
  if (pipeline_.sdxl()) models.push_back(text_encoder("text_encoder_2", pipeline_.text_encoder_2));
  return models;
}

std::vector<std::string> DiffusionTask::captions_of(const io::ImageTensors& batch, const io::ImageDataset& set) const {
  const DreamBoothSettings& dreambooth = settings_.dreambooth;
  const bool instance = &set == train_.get() || &set == val_.get();
  if (&set == classes_.get() || (instance && !dreambooth.instance_prompt.empty())) {
    return std::vector<std::string>(batch.captions.size(), instance ? dreambooth.instance_prompt : dreambooth.class_prompt);
  }
  std::vector<std::string> names;  // read only when an image has no caption
  std::vector<std::string> captions;
  for (size_t i = 0; i < batch.captions.size(); ++i) {
    if (batch.captions[i]) {
      captions.push_back(*batch.captions[i]);
      continue;
    }
    const auto label = static_cast<size_t>(batch.labels[static_cast<int64_t>(i)].item<int64_t>());
    if (label < settings_.class_captions.size()) {
      captions.push_back(settings_.class_captions[label]);
      continue;
    }
    if (names.empty()) names = set.class_names();
    captions.push_back(names.at(label));
  }
  return captions;
}

PromptEmbeddings DiffusionTask::encode_text(const std::vector<std::string>& captions) {
  torch::NoGradGuard no_grad;
  PromptEmbeddings e = encode_prompts(pipeline_, captions);
  const torch::ScalarType dtype = pipeline_.unet->conv_in->weight.scalar_type();
  e.text = e.text.to(dtype);
  if (e.pooled.defined()) e.pooled = e.pooled.to(dtype);
  return e;
}

void DiffusionTask::fill_cache() {
  torch::NoGradGuard no_grad;
  const auto n = static_cast<size_t>(train_->size());
  cached_moments_.assign(n, torch::Tensor());
  cached_text_.assign(n, PromptEmbeddings());
  cached_placements_.assign(n, io::ImagePlacement());
  cached_captions_.assign(n, std::string());
  std::vector<size_t> all(n);
  std::iota(all.begin(), all.end(), size_t{0});
  for_each_bucket_chunk(all, train_groups_, settings_.train.micro_batch_size, [&](const std::vector<size_t>& items, int64_t) {
    const io::ImageTensors batch = io::batch_replacing_unreadable(*train_, items, /*train=*/false, settings_.train.seed);
    const auto posterior = pipeline_.vae->encode(batch.pixels.to(device_, pipeline_.vae->quant_conv->weight.scalar_type()));
    const torch::Tensor moments = torch::cat({posterior.mean, posterior.logvar}, 1).to(torch::kFloat32);  // [b, 2C, h, w]
    const std::vector<std::string> captions = captions_of(batch, *train_);
    const PromptEmbeddings text = text_in_graph() ? PromptEmbeddings() : encode_text(captions);  // else encoded anew every step
    for (size_t k = 0; k < items.size(); ++k) {
      const size_t item = items[k];
      const auto row = static_cast<int64_t>(k);
      cached_moments_[item] = moments[row];
      cached_placements_[item] = batch.placements[k];
      cached_captions_[item] = captions[k];
      if (text.text.defined()) cached_text_[item] = {text.text[row], text.pooled.defined() ? text.pooled[row] : torch::Tensor()};
    }
  });
}

DiffusionInputs DiffusionTask::inputs(const std::vector<size_t>& items, const std::vector<RowDraws>& draws, bool train,
                                      uint64_t augment_seed) {
  return inputs_from(train ? *train_ : *val_, train, items, draws, augment_seed);
}

DiffusionInputs DiffusionTask::inputs_from(io::ImageDataset& set, bool train, const std::vector<size_t>& items,
                                           const std::vector<RowDraws>& draws, uint64_t augment_seed) {
  torch::NoGradGuard no_grad;
  if (!empty_caption_.text.defined()) empty_caption_ = encode_text({""});
  AutoencoderKLImpl::Posterior posterior;  // float32
  PromptEmbeddings text;
  std::vector<io::ImagePlacement> placements;  // each row's source size and crop
  std::vector<std::string> image_captions;     // each row's, when the text is encoded in the graph (below)
  const bool text_in_graph = this->text_in_graph();
  if (&set == train_.get() && settings_.diffusion.cache) {
    if (cached_moments_.empty()) fill_cache();
    std::vector<torch::Tensor> moments, texts, pooled;
    for (const size_t item : items) {
      moments.push_back(cached_moments_.at(item));
      placements.push_back(cached_placements_.at(item));
      image_captions.push_back(cached_captions_.at(item));
      if (text_in_graph) continue;
      texts.push_back(cached_text_.at(item).text);
      if (cached_text_[item].pooled.defined()) pooled.push_back(cached_text_[item].pooled);
    }
    const std::vector<torch::Tensor> parts = torch::stack(moments).chunk(2, 1);
    posterior = {parts[0], parts[1]};
    if (!text_in_graph) text = {torch::stack(texts), pooled.empty() ? torch::Tensor() : torch::stack(pooled)};
  } else {
    const io::ImageTensors batch = io::batch_replacing_unreadable(set, items, train, augment_seed);
    const auto encoded = pipeline_.vae->encode(batch.pixels.to(device_, pipeline_.vae->quant_conv->weight.scalar_type()));
    posterior = {encoded.mean.to(torch::kFloat32), encoded.logvar.to(torch::kFloat32)};
    image_captions = captions_of(batch, set);
    if (!text_in_graph) text = encode_text(image_captions);
    placements = batch.placements;
  }
  std::vector<torch::Tensor> posterior_noise, noise;
  std::vector<int64_t> timesteps;
  for (size_t i = 0; i < draws.size(); ++i) {
    posterior_noise.push_back(draws[i].posterior_noise);
    noise.push_back(draws[i].noise);
    timesteps.push_back(draws[i].timestep);
    if (draws[i].drop_caption && text.text.defined()) {
      text.text[static_cast<int64_t>(i)].copy_(empty_caption_.text[0]);
      if (text.pooled.defined()) text.pooled[static_cast<int64_t>(i)].copy_(empty_caption_.pooled[0]);
    }
  }
  if (text_in_graph) {
    // The trained text: the concept's rows, or the encoders' adapters, with gradients in training.
    torch::AutoGradMode grad(train);
    if (tokens_) {
      pipeline_.added_token_rows = tokens_->rows;
      pipeline_.added_token_rows_2 = tokens_->rows_2;
    }
    const PromptEmbeddings e = encode_prompts(pipeline_, graph_captions(draws, image_captions));
    const torch::ScalarType dtype = pipeline_.unet->conv_in->weight.scalar_type();
    text = {e.text.to(dtype), e.pooled.defined() ? e.pooled.to(dtype) : torch::Tensor()};
  }
  DiffusionInputs in;
  in.latents = posterior.sample(torch::stack(posterior_noise).to(device_)) * pipeline_.vae->config.scaling_factor;  // [B, C, h, w]
  in.text = text.text;
  if (pipeline_.sdxl()) {
    const int64_t scale = pipeline_.vae_scale();
    in.added = {text.pooled, training_time_ids(placements, in.latents.size(2) * scale, in.latents.size(3) * scale, text.text.options())};
  }
  in.noise = torch::stack(noise).to(device_);
  in.timesteps = torch::tensor(timesteps).to(device_);
  return in;
}

std::map<std::string, torch::Tensor> DiffusionTask::losses(int64_t step, int64_t first_row, int64_t rows) {
  const int64_t group = grouped_ ? grouped_->group(step) : 0;
  const std::vector<size_t> items = grouped_ ? grouped_->rows(step, first_row, rows) : order_->rows(step, first_row, rows);
  const std::vector<int64_t> shape = latent_shape(group);
  std::vector<RowDraws> draws;
  for (int64_t r = 0; r < rows; ++r) {
    draws.push_back(draw_row(settings_.train.seed, step, first_row + r, shape, schedule_.train_timesteps(), settings_.diffusion));
  }
  const uint64_t seed = settings_.train.seed;
  const DiffusionInputs in = inputs(items, draws, /*train=*/true, mix_seed(seed, step, 0, kAugment));
  if (!classes_) return with_text_encoders({{trained_name(), diffusion_loss(pipeline_.unet, schedule_, in, settings_.diffusion.min_snr_gamma)}});
  // Prior preservation: row r's class image and draws, from (seed, step, r) as its own.
  const ClassPool& pool = class_pool(group);
  const std::vector<int64_t> class_shape = latent_shape(pool.group);
  std::vector<size_t> class_items;
  std::vector<RowDraws> class_draws;
  for (int64_t r = first_row; r < first_row + rows; ++r) {
    class_items.push_back(pool.items[mix_seed(seed, step, r, kClassItem) % pool.items.size()]);
    class_draws.push_back(draw_row(mix_seed(seed, 0, 0, kClassDraws), step, r, class_shape, schedule_.train_timesteps(), settings_.diffusion));
  }
  const DiffusionInputs prior = inputs_from(*classes_, /*train=*/true, class_items, class_draws, mix_seed(seed, step, 0, kClassAugment));
  return with_text_encoders({{trained_name(), prior_preservation_loss(pipeline_.unet, schedule_, in, prior,
                                                                     settings_.dreambooth.prior_loss_weight, settings_.diffusion.min_snr_gamma)}});
}

std::map<std::string, torch::Tensor> DiffusionTask::with_text_encoders(std::map<std::string, torch::Tensor> losses) const {
  if (!text_encoder_lora_) return losses;
  // The trainer adds the models' losses into one backward: the UNet's alone carries the gradient, which reaches
  // the text encoders' adapters through the text; theirs is its value, for the log.
  const torch::Tensor shared = losses.at("unet").detach();
  losses["text_encoder"] = shared;
  if (pipeline_.sdxl()) losses["text_encoder_2"] = shared;
  return losses;
}

train::LossSum DiffusionTask::evaluate(int rank, int ranks) {
  torch::NoGradGuard no_grad;
  const auto [begin, end] = evaluation_share(val_->size(), settings_.train.eval_rows, rank, ranks);
  DiffusionSettings plain;  // no caption dropout; the same noise offset as training
  plain.noise_offset = settings_.diffusion.noise_offset;
  train::LossSum sums;
  std::vector<size_t> share;
  for (int64_t i = begin; i < end; ++i) share.push_back(static_cast<size_t>(i));
  for_each_bucket_chunk(share, val_groups_, settings_.train.micro_batch_size, [&](const std::vector<size_t>& items, int64_t group) {
    std::vector<RowDraws> draws;
    for (const size_t i : items) {
      draws.push_back(draw_row(settings_.train.seed, -kEvalDraws, static_cast<int64_t>(i), latent_shape(group), schedule_.train_timesteps(), plain));
    }
    const DiffusionInputs in = inputs(items, draws, /*train=*/false, 0);
    sums.loss_sum += diffusion_row_losses(pipeline_.unet, schedule_, in).sum().item<double>();
    sums.count += static_cast<double>(items.size());
  });
  return sums;
}

void DiffusionTask::after_evaluation(int64_t step, const std::string& out_dir, bool main) {
  const TrainingSamples& wanted = settings_.samples;
  if (wanted.prompts.empty()) return;
  const bool training = pipeline_.unet->is_training();
  pipeline_.unet->eval();
  if (tokens_) {  // the rows as evaluated (the moving average's where there is one)
    pipeline_.added_token_rows = tokens_->rows;
    pipeline_.added_token_rows_2 = tokens_->rows_2;
  }
  const Samples samples = sample(pipeline_, wanted.prompts, wanted.options);  // every rank: the UNet's blocks may gather
  pipeline_.unet->train(training);
  if (!main) return;
  const std::filesystem::path folder = std::filesystem::path(out_dir) / "samples";
  std::filesystem::create_directories(folder);
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld.png", static_cast<long long>(step));
  auto text = sample_png_text(wanted.prompts, std::to_string(wanted.options.seed), wanted.options);
  text.insert(text.end(), {{"training step", std::to_string(step)}, {"software", "kuafu-sd"}});
  io::write_png((folder / name).string(), sample_grid(samples.images), text);
}

double DiffusionTask::flops_per_item() const {
  const UNetConfig& c = pipeline_.unet->config;
  return 3 * c.forward_flops(c.sample_size, c.sample_size, pipeline_.tokenizer.max_length());  // forward + backward
}

std::unique_ptr<DiffusionTask> make_diffusion_task(const config::Config& config, const SdSettings& settings, Pipeline pipeline,
                                                   const torch::Device& device) {
  const int64_t side = pipeline.unet->config.sample_size * pipeline.vae_scale();
  const int64_t channels = pipeline.vae->config.in_channels;
  std::vector<io::ImageSize> buckets = sd_buckets(config, settings.buckets, side, pipeline.size_multiple());
  std::unique_ptr<io::ImageDataset> train = open_captioned_images(config, true, channels, side, buckets);  // the training set's
  std::unique_ptr<io::ImageDataset> val = open_captioned_images(config, false, channels, side, buckets);   // problems first
  return std::make_unique<DiffusionTask>(std::move(pipeline), settings, std::move(train), std::move(val), std::move(buckets), device);
}

}  // namespace kuafu::sd
