// kuafu-sd's config for training and fine-tuning: the pipeline folder it starts from (model.*), the
// captioned image set (data.*, augment.*), the objective's options (diffusion.*), and the trainer's,
// runtime's and benchmark's keys. Read once per command into SdSettings.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "apps/stable_diffusion/pipeline.h"
#include "core/config/config.h"
#include "core/nn/lora.h"
#include "core/io/image_dataset.h"
#include "core/train/train_settings.h"

namespace kuafu::sd {

config::Schema sd_schema();

// diffusion.*
struct DiffusionSettings {
  double caption_dropout = 0;  // the share of rows trained on the empty caption's encoding (for guidance)
  double min_snr_gamma = 0;    // 0: plain mean squared error
  double noise_offset = 0;     // ε + offset · N(0, 1) per row and channel (darker and brighter images)
  bool cache = false;          // encode every training image and caption once, before the first step
};

// vae.*: training the VAE (model.train = "vae").
struct VaeTrainingSettings {
  double kl_weight = 1e-4;     // the KL term's weight beside the reconstruction's mean squared error
  int64_t scale_images = 256;  // training images whose latents set the exported scaling_factor
};

// textual_inversion.*: model.train = "textual_inversion" (diffusers' textual_inversion.py): a new concept's
// token embeddings trained, everything else frozen.
struct TextualInversionSettings {
  std::string token;        // the concept's name in prompts, e.g. "<my-cat>" (a word the vocabulary lacks)
  std::string initializer;  // one word of the vocabulary whose embedding every vector starts from
  int64_t vectors = 1;      // embeddings the concept spans (its tokens: token, token_1, ...)
  std::vector<std::string> templates;  // training captions, "{}" where the concept goes; one drawn per row
  bool image_captions = false;         // instead: each image's own caption, its "{}" read as the token
};

// dreambooth.*: DreamBooth (Ruiz et al. 2023, as diffusers' train_dreambooth.py): the training images are
// the instance's, each captioned dreambooth.instance_prompt; with dreambooth.class_data each row is paired
// with a class image captioned dreambooth.class_prompt (the pipeline's own samples, made when the folder
// holds fewer than dreambooth.class_images), whose plain squared error joins the loss at
// dreambooth.prior_loss_weight (prior preservation).
struct DreamBoothSettings {
  std::string instance_prompt;  // "": the images' own captions
  std::string class_data;       // "": no prior preservation
  std::string class_prompt;
  int64_t class_images = 100;
  double prior_loss_weight = 1.0;
  int64_t class_sample_steps = 50;  // the class images' sampling (the folder's sampler)
  double class_guidance = 7.5;
  bool prior_preservation() const { return !class_data.empty(); }
};

// buckets.*: aspect-ratio bucketing (kohya-ss sd-scripts' --enable_bucket): each image is resized to cover the
// bucket (a size of about the training resolution's area) nearest its aspect ratio and cut to it, nothing cut
// when the ratios agree; every step's batch holds the images of one bucket.
struct BucketSettings {
  bool enabled = false;
  int64_t step = 64;      // sides are multiples of it (and of the pipeline's size_multiple)
  int64_t min_side = 0;   // 0: half the resolution (to a step)
  int64_t max_side = 0;   // 0: twice the resolution
};
// buckets.*'s buckets for a pipeline training at `resolution` pixels whose sides must divide by `multiple` (none
// when off). Fails naming the buckets.* key that allows none.
std::vector<io::ImageSize> sd_buckets(const config::Config& config, const BucketSettings& b, int64_t resolution, int64_t multiple);

// sample.*: images sampled at each evaluation, on the moving average where there is one.
struct TrainingSamples {
  std::vector<std::string> prompts;  // none: no samples
  SampleOptions options;             // sample.steps, sample.guidance and sample.seed; the folder's sampler
};

struct SdSettings {
  std::string pipeline;  // model.pipeline: the diffusers pipeline folder the run starts from
  std::string trained = "unet";  // model.train: what trains ("unet", "vae" or "textual_inversion"), the rest frozen
  bool new_unet = false;  // model.new_unet: a fresh UNet of the folder's unet/config.json (training from scratch)
  bool text_encoder_lora = false;  // lora.text_encoder: the text encoder(s) get adapters too (text_encoder_lora_spec)
  DiffusionSettings diffusion;
  TrainingSamples samples;
  VaeTrainingSettings vae;
  TextualInversionSettings textual_inversion;
  DreamBoothSettings dreambooth;
  BucketSettings buckets;
  train::TrainSettings train;
  std::vector<std::string> class_captions;  // data.class_captions: a caption per label for sets without captions
};
SdSettings read_sd_settings(const config::Config& config);

// lora.text_encoder's adapters: the UNet's rank, alpha and dropout on CLIP's attention projections (q_proj,
// k_proj, v_proj, out_proj: diffusers' and sd-scripts' text-encoder targets).
nn::LoraSpec text_encoder_lora_spec(const nn::LoraSpec& unet);

// The training (`train`) or evaluation set of data.*, as `channels` × `size`² images in [−1, 1] (the
// VAE's input), or each in its bucket of `buckets` (sd_buckets). An image without a caption is captioned
// data.class_captions[label], else its class's name. Fails naming the key when a file or folder is missing or
// malformed or its channels are not `channels`.
// Items [begin, end) in consecutive chunks of at most `chunk`, each handed to `use` as its item list.
void for_each_chunk(int64_t begin, int64_t end, int64_t chunk, const std::function<void(const std::vector<size_t>& items)>& use);
// Rank `rank` of `ranks`'s share [begin, end) of the first `limit` (0: all) of `size` evaluation items.
std::pair<int64_t, int64_t> evaluation_share(int64_t size, int64_t limit, int rank, int ranks);

std::unique_ptr<io::ImageDataset> open_captioned_images(const config::Config& config, bool train, int64_t channels, int64_t size,
                                                        const std::vector<io::ImageSize>& buckets = {});
// DreamBooth's class images (dreambooth.class_data, a folder of one sub-folder per class), as the training set's.
std::unique_ptr<io::ImageDataset> open_class_images(const config::Config& config, int64_t channels, int64_t size,
                                                    const std::vector<io::ImageSize>& buckets = {});

}  // namespace kuafu::sd
