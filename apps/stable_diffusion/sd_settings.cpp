#include "apps/stable_diffusion/sd_settings.h"

#include <filesystem>

#include "apps/stable_diffusion/new_pipeline.h"
#include "core/io/image_folder.h"
#include "core/train/benchmark.h"
#include "core/train/peft_adapter.h"
#include "core/train/runtime.h"
#include "core/train/trainer.h"
#include "core/util/error.h"

namespace kuafu::sd {

config::Schema sd_schema() {
  config::Schema s;
  train::add_runtime_schema(s);
  train::add_trainer_schema(s);
  train::add_benchmark_schema(s);
  s.add_int("benchmark.sampling_steps", 0, "time sampling instead of training: DDIM loops of this many steps under guidance "
                                           "7.5, the UNet alone in precision.dtype (benchmark.steps loops timed; 0: time training)")
      .min(0);
  train::add_model_sections(s, {"unet", "text_encoder", "vae", "tokens"});
  train::add_lora_schema(s, {"to_q", "to_k", "to_v", "to_out.0"});  // the UNet's attention projections
  s.add_bool("lora.text_encoder", false, "LoRA on the text encoder(s) too (q_proj, k_proj, v_proj, out_proj; lora.rank and alpha), "
                                         "trained with the UNet's (diffusers' --train_text_encoder)");
  add_init_schema(s);
  s.add_string("prepare.recipe", "emoji", "prepare: the data recipe, written to data.train and data.val (emoji: Debian's "
                                          "ruby-tanuki-emoji, one skin tone per base held out)")
      .choices({"emoji"});
  s.add_string("prepare.source", "/usr/share/rubygems-integration/all/gems/tanuki_emoji-0.6.0",
               "prepare: the package's folder (the tanuki_emoji gem)");
  s.add_string("model.pipeline", "", "the diffusers pipeline folder to start from (model_index.json, unet/, vae/, "
                                     "text_encoder/, tokenizer/, scheduler/); the VAE and text encoder stay frozen");
  s.add_string("model.train", "unet", "what trains: unet (text to image; the VAE and text encoder frozen), vae "
                                      "(reconstruction + KL, the first stage of a model trained from scratch) or "
                                      "textual_inversion (a new token's embeddings, all else frozen)")
      .choices({"unet", "vae", "textual_inversion"});
  s.add_string("textual_inversion.token", "", "model.train = \"textual_inversion\": the new concept's name in prompts, "
                                              "e.g. \"<my-cat>\" (not a word of the vocabulary)");
  s.add_string("textual_inversion.initializer", "", "one word (a single token) whose embedding the concept starts from");
  s.add_int("textual_inversion.vectors", 1, "embeddings the concept spans (tokens <t>, <t>_1, ...)").min(1).max(64);
  s.add_string_list("textual_inversion.templates", {"a photo of {}", "a picture of {}", "a rendering of {}", "a close-up photo of {}",
                                                    "a bright photo of {}", "a dark photo of {}", "a drawing of {}", "an image of {}",
                                                    "a cropped photo of {}", "a good photo of {}", "a small {}", "a large {}"},
                    "training captions, {} where the concept goes; each row draws one");
  s.add_string("dreambooth.instance_prompt", "", "DreamBooth: every training image's caption, e.g. \"a photo of sks dog\" "
                                                 "(\"\": the images' own captions)");
  s.add_string("dreambooth.class_data", "", "prior preservation: a folder of class images (made by the pipeline itself when it "
                                            "holds fewer than dreambooth.class_images); \"\": none");
  s.add_string("dreambooth.class_prompt", "", "the class images' caption, e.g. \"a photo of dog\" (also what makes them)");
  s.add_int("dreambooth.class_images", 100, "class images the prior preservation draws from (made up to this many)").min(1);
  s.add_float("dreambooth.prior_loss_weight", 1.0, "the class rows' squared error's weight beside the instance rows'").min(0);
  s.add_int("dreambooth.class_sample_steps", 50, "sampling steps of the class images made (the folder's sampler)").min(1);
  s.add_float("dreambooth.class_guidance", 7.5, "their classifier-free guidance scale");
  s.add_string("textual_inversion.captions", "templates", "templates (textual_inversion.templates, as diffusers' script) or "
                                                          "images (each image's own caption, {} in it read as the token)")
      .choices({"templates", "images"});
  s.add_float("vae.kl_weight", 1e-4, "model.train = \"vae\": the KL term's weight (per latent element) beside the "
                                     "reconstruction's mean squared error (per pixel)").min(0);
  s.add_int("vae.scale_images", 256, "model.train = \"vae\": training images whose latents' spread sets the exported "
                                     "scaling_factor").min(1);
  s.add_bool("model.new_unet", false, "train the UNet from scratch: the folder's unet/config.json, freshly initialised");
  s.add_float("export.max_shard_mb", 5120, "`export` cuts the UNet's weights into files of at most this size").min(1);

  s.add_float("diffusion.caption_dropout", 0.0, "share of training rows given the empty caption (classifier-free guidance)")
      .min(0).max(1);
  s.add_float("diffusion.min_snr_gamma", 0.0, "Min-SNR-γ loss weighting (Hang et al. 2023; 5 is usual); 0 = off").min(0);
  s.add_float("diffusion.noise_offset", 0.0, "noise offset: ε + offset · N(0, 1) per row and channel; 0 = off").min(0).max(1);
  s.add_bool("diffusion.cache", false, "encode every training image (the VAE's Gaussian) and caption once before training "
                                       "(needs augment.flip = false)");

  s.add_string_list("sample.prompts", {}, "prompts sampled at each evaluation (on the moving average) into "
                                         "<train.out_dir>/samples/step_<N>.png, side by side; none: no samples");
  s.add_int("sample.steps", 25, "sampling steps of those samples (the folder's scheduler class)").min(1);
  s.add_float("sample.guidance", 4.0, "their classifier-free guidance scale; 1 or less: none");
  s.add_int("sample.seed", 0, "their initial noise's seed (the same at every evaluation, so the images compare)").min(0);

  s.add_string("data.format", "folder", "folder (one sub-folder per class, JPEG/PNG, captions in <image>.txt), idx "
                                        "(MNIST-style files) or hdf5 (uint8 images, labels and captions)")
      .choices({"idx", "folder", "hdf5"});
  s.add_string("data.train", "", "idx: path prefix of the -images-idx3-ubyte.gz / -labels-idx1-ubyte.gz files; folder: the "
                                 "training folder; hdf5: the training file");
  s.add_string("data.val", "", "the same for the evaluation set");
  s.add_string("data.hdf5_images", "images", "hdf5: dataset of uint8 images [N, H, W] or [N, H, W, C]");
  s.add_string("data.hdf5_labels", "labels", "hdf5: dataset of integer labels [N]");
  s.add_string("data.hdf5_captions", "captions", "hdf5: dataset of caption strings [N] (optional)");
  s.add_string_list("data.class_captions", {}, "a caption per label, for images without one (e.g. Fashion-MNIST's class names)");
  s.add_int("data.workers", 0, "image decoding threads per rank; 0 = runtime.threads").min(0);
  s.add_int("data.max_corrupt_images", 100, "unreadable images skipped (and reported) before the run fails").min(0);
  s.add_bool("augment.flip", false, "random horizontal flips");
  s.add_string("augment.crop", "center",
               "the shorter side resized to the resolution, then the square cut at the center or, in training, anywhere "
               "(random): diffusers' --center_crop or its default RandomCrop")
      .choices({"center", "random"});
  s.add_bool("buckets.enable", false, "aspect-ratio bucketing (kohya's --enable_bucket): each image resized to cover the bucket "
                                      "nearest its aspect ratio and cut to it (nothing cut when they agree), each step's images "
                                      "from one bucket; augment.crop then says where the cut lies");
  s.add_int("buckets.step", 64, "bucket sides are multiples of this many pixels (and of the pipeline's VAE and UNet factors)").min(1);
  s.add_int("buckets.min_side", 0, "the shortest bucket side in pixels; 0 = half the training resolution").min(0);
  s.add_int("buckets.max_side", 0, "the longest bucket side in pixels; 0 = twice the training resolution").min(0);
  return s;
}

std::vector<io::ImageSize> sd_buckets(const config::Config& config, const BucketSettings& b, int64_t resolution, int64_t multiple) {
  if (!b.enabled) return {};
  if (b.step % multiple != 0) {
    config.fail_at("buckets.step", std::to_string(b.step) + " is not a multiple of " + std::to_string(multiple) +
                                       ", the pixels this pipeline's image sides divide by (its VAE's factor times its UNet's downsamplings)");
  }
  io::BucketSpec spec;
  spec.resolution = resolution;
  spec.step = b.step;
  spec.min_side = b.min_side > 0 ? b.min_side : std::max(b.step, resolution / 2 / b.step * b.step);
  spec.max_side = b.max_side > 0 ? b.max_side : 2 * resolution / b.step * b.step;
  try {
    return io::aspect_buckets(spec);
  } catch (const Error& e) {
    config.fail_at("buckets.enable", e.what());
  }
}

SdSettings read_sd_settings(const config::Config& config) {
  SdSettings s;
  s.pipeline = config.get_string("model.pipeline");
  if (s.pipeline.empty()) config.fail_at("model.pipeline", "is empty; name a diffusers pipeline folder to start from");
  if (!std::filesystem::exists(std::filesystem::path(s.pipeline) / "model_index.json")) {
    config.fail_at("model.pipeline", "= " + s.pipeline + " is not a diffusers pipeline folder (no model_index.json there)");
  }
  s.new_unet = config.get_bool("model.new_unet");
  s.trained = config.get_string("model.train");
  s.vae.kl_weight = config.get_float("vae.kl_weight");
  s.vae.scale_images = config.get_int("vae.scale_images");
  s.diffusion.caption_dropout = config.get_float("diffusion.caption_dropout");
  s.diffusion.min_snr_gamma = config.get_float("diffusion.min_snr_gamma");
  s.diffusion.noise_offset = config.get_float("diffusion.noise_offset");
  s.diffusion.cache = config.get_bool("diffusion.cache");
  if (s.diffusion.cache && config.get_bool("augment.flip")) {
    config.fail_at("diffusion.cache", "= true encodes each image once, so it cannot be flipped anew each epoch; set augment.flip = false");
  }
  if (s.diffusion.cache && config.get_string("augment.crop") == "random") {
    config.fail_at("diffusion.cache", "= true encodes each image once, so it cannot be cropped anew each epoch; set augment.crop = \"center\"");
  }
  if (s.trained == "textual_inversion") {
    TextualInversionSettings& t = s.textual_inversion;
    t.token = config.get_string("textual_inversion.token");
    if (t.token.empty()) config.fail_at("textual_inversion.token", "is empty; name the new concept, e.g. \"<my-cat>\"");
    t.initializer = config.get_string("textual_inversion.initializer");
    if (t.initializer.empty()) config.fail_at("textual_inversion.initializer", "is empty; name a word the concept starts from, e.g. \"cat\"");
    t.vectors = config.get_int("textual_inversion.vectors");
    t.templates = config.get_string_list("textual_inversion.templates");
    t.image_captions = config.get_string("textual_inversion.captions") == "images";
    if (t.image_captions) t.templates.clear();
    if (!t.image_captions && t.templates.empty()) {
      config.fail_at("textual_inversion.templates", "is empty; give captions with {} where the concept goes");
    }
    for (const std::string& line : t.templates) {
      if (line.find("{}") == std::string::npos) config.fail_at("textual_inversion.templates", "\"" + line + "\" has no {} for the concept");
    }
    if (s.new_unet) config.fail_at("model.new_unet", "= true trains a UNet from scratch; textual inversion keeps the folder's UNet");
  }
  s.text_encoder_lora = config.get_bool("lora.text_encoder");
  if (s.text_encoder_lora && (config.get_int("lora.rank") == 0 && config.get_string("lora.init_from").empty())) {
    config.fail_at("lora.text_encoder", "= true needs lora.rank > 0: the text encoders' adapters take the UNet's rank");
  }
  if (s.text_encoder_lora && s.trained != "unet") config.fail_at("lora.text_encoder", "= true trains with the UNet (model.train = \"unet\")");
  if (s.text_encoder_lora && config.get_string("precision.dtype") == "fp16") {
    // One backward carries the UNet's loss into both models, which fp16 would scale apart.
    config.fail_at("lora.text_encoder", "= true is not built for precision.dtype = \"fp16\" (each model's loss scale); use bf16");
  }
  DreamBoothSettings& d = s.dreambooth;
  d.instance_prompt = config.get_string("dreambooth.instance_prompt");
  d.class_data = config.get_string("dreambooth.class_data");
  d.class_prompt = config.get_string("dreambooth.class_prompt");
  d.class_images = config.get_int("dreambooth.class_images");
  d.prior_loss_weight = config.get_float("dreambooth.prior_loss_weight");
  d.class_sample_steps = config.get_int("dreambooth.class_sample_steps");
  d.class_guidance = config.get_float("dreambooth.class_guidance");
  if (d.prior_preservation() && d.class_prompt.empty()) {
    config.fail_at("dreambooth.class_prompt", "is empty; prior preservation captions (and makes) its class images with it");
  }
  if (d.prior_preservation() && s.trained == "vae") config.fail_at("dreambooth.class_data", "is for the UNet's training, not the VAE's");
  s.buckets.enabled = config.get_bool("buckets.enable");
  s.buckets.step = config.get_int("buckets.step");
  s.buckets.min_side = config.get_int("buckets.min_side");
  s.buckets.max_side = config.get_int("buckets.max_side");
  if (s.buckets.enabled && s.trained == "vae") config.fail_at("buckets.enable", "= true is for the UNet's training; the VAE trains on squares");
  s.samples.prompts = config.get_string_list("sample.prompts");
  s.samples.options.steps = config.get_int("sample.steps");
  s.samples.options.guidance = config.get_float("sample.guidance");
  s.samples.options.seed = static_cast<uint64_t>(config.get_int("sample.seed"));
  s.train = train::read_train_settings(config);
  s.class_captions = config.get_string_list("data.class_captions");
  return s;
}

nn::LoraSpec text_encoder_lora_spec(const nn::LoraSpec& unet) {
  nn::LoraSpec spec = unet;
  spec.targets = {"q_proj", "k_proj", "v_proj", "out_proj"};
  return spec;
}

void for_each_chunk(int64_t begin, int64_t end, int64_t chunk, const std::function<void(const std::vector<size_t>& items)>& use) {
  chunk = std::max<int64_t>(1, chunk);
  for (int64_t first = begin; first < end; first += chunk) {
    std::vector<size_t> items;
    for (int64_t i = first; i < std::min(end, first + chunk); ++i) items.push_back(static_cast<size_t>(i));
    use(items);
  }
}

std::pair<int64_t, int64_t> evaluation_share(int64_t size, int64_t limit, int rank, int ranks) {
  const int64_t n = limit > 0 ? std::min(size, limit) : size;
  return {n * rank / ranks, n * (rank + 1) / ranks};
}

namespace {

// The images of `key`'s folder or file (`format`: data.format's choices).
std::unique_ptr<io::ImageDataset> open_images(const config::Config& config, const std::string& key, const std::string& format, bool train,
                                              int64_t channels, int64_t size, const std::vector<io::ImageSize>& buckets) {
  io::ImageSetSpec spec;
  spec.format = format;
  spec.path = config.get_string(key);
  if (spec.path.empty()) config.fail_at(key, "is empty; name the " + std::string(train ? "training" : "evaluation") + " images");
  spec.hdf5_images = config.get_string("data.hdf5_images");
  spec.hdf5_labels = config.get_string("data.hdf5_labels");
  spec.hdf5_captions = config.get_string("data.hdf5_captions");
  spec.threads = static_cast<int>(config.get_int("data.workers"));
  spec.max_corrupt_images = config.get_int("data.max_corrupt_images");
  io::ImageTransform& t = spec.transform;
  t.size = static_cast<int>(size);
  t.channels = static_cast<int>(channels);
  t.square_crop = true;  // as diffusers' scripts: never stretched to the square
  t.random_square_crop = train && config.get_string("augment.crop") == "random";
  t.buckets = buckets;
  t.flip = config.get_bool("augment.flip");
  t.mean.assign(static_cast<size_t>(channels), 0.5f);  // to [−1, 1], the VAE's range
  t.std.assign(static_cast<size_t>(channels), 0.5f);
  if (spec.format == "folder" && !train) {  // labelled by the training folder's classes: its problems are its own
    const std::string train_path = config.get_string("data.train");
    if (train_path.empty()) config.fail_at("data.train", "is empty; name the training images");
    try {
      spec.classes = io::image_folder_classes(train_path);
    } catch (const Error& e) {
      config.fail_at("data.train", e.what());
    }
  }
  std::unique_ptr<io::ImageDataset> set;
  try {
    set = io::open_image_dataset(spec);
  } catch (const Error& e) {
    config.fail_at(key, e.what());
  }
  const int64_t stored = set->stored_channels();
  if (stored != 0 && stored != channels) {
    config.fail_at(key, "holds images of " + std::to_string(stored) + " channel(s) but the pipeline's VAE reads " +
                            std::to_string(channels));
  }
  return set;
}

}  // namespace

std::unique_ptr<io::ImageDataset> open_captioned_images(const config::Config& config, bool train, int64_t channels, int64_t size,
                                                        const std::vector<io::ImageSize>& buckets) {
  return open_images(config, train ? "data.train" : "data.val", config.get_string("data.format"), train, channels, size, buckets);
}

std::unique_ptr<io::ImageDataset> open_class_images(const config::Config& config, int64_t channels, int64_t size,
                                                    const std::vector<io::ImageSize>& buckets) {
  return open_images(config, "dreambooth.class_data", "folder", /*train=*/true, channels, size, buckets);
}

}  // namespace kuafu::sd
