// Latent diffusion training as the trainer sees it: the pipeline's UNet trained ("unet"), its text
// encoder(s) and VAE frozen ("text_encoder", SDXL's "text_encoder_2", "vae"; not saved: the pipeline folder
// holds them); or, for textual inversion, a new concept's token embeddings trained ("tokens") and the UNet
// frozen too, each row captioned by a template naming the concept. An SDXL UNet also gets each row's pooled text and time ids (the image uncropped at its size,
// as train_text_to_image_sdxl.py makes them for an image already at the training resolution). Each row of a
// step draws, from (seed, step, row) alone, the VAE posterior's noise, the diffusion noise (plus the
// noise offset), its timestep and whether its caption is dropped to the empty caption's encoding, so a
// row's loss is the same whichever rank or micro-batch computes it and a resumed run goes on exactly.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/stable_diffusion/diffusion_loss.h"
#include "apps/stable_diffusion/learned_tokens.h"
#include "apps/stable_diffusion/pipeline.h"
#include "apps/stable_diffusion/sd_settings.h"
#include "core/io/epoch_order.h"
#include "core/nn/lora.h"
#include "core/train/trainer.h"

namespace kuafu::sd {

// What one row draws for a step.
struct RowDraws {
  torch::Tensor posterior_noise;  // [C, h, w]: the latent sampled from the VAE's Gaussian with it
  torch::Tensor noise;            // [C, h, w]: ε, the noise offset added
  int64_t timestep = 0;           // in [0, T)
  bool drop_caption = false;
  int64_t caption_choice = 0;     // in [0, 2^31): textual inversion's template, this modulo their count
};
// diffusers' noise offset: `noise` [.., C, h, w] + amount × `draws` [.., C, 1, 1], one draw per channel over the whole latent.
torch::Tensor offset_noise(const torch::Tensor& noise, const torch::Tensor& draws, double amount);
RowDraws draw_row(uint64_t seed, int64_t step, int64_t row, const std::vector<int64_t>& latent_shape, int64_t train_timesteps,
                  const DiffusionSettings& settings);

class DiffusionTask : public train::RunTask {
 public:
  // `buckets`: buckets.*'s (sd_buckets), which the sets were opened with; none without bucketing.
  DiffusionTask(Pipeline pipeline, SdSettings settings, std::unique_ptr<io::ImageDataset> train, std::unique_ptr<io::ImageDataset> val,
                std::vector<io::ImageSize> buckets, const torch::Device& device);

  std::vector<train::RunModel> models() override;
  std::map<std::string, torch::Tensor> losses(int64_t step, int64_t first_row, int64_t rows) override;
  // The unweighted mean squared error over the evaluation images, each at its own fixed timestep and
  // noise (the same at every evaluation, so curves compare runs with and without Min-SNR).
  train::LossSum evaluate(int rank, int ranks) override;
  std::vector<train::EvalMetric> eval_metrics(const train::LossSum&) const override { return {}; }
  // sample.prompts, sampled from the same noise at every evaluation: <out_dir>/samples/step_<N>.png.
  void after_evaluation(int64_t step, const std::string& out_dir, bool main) override;
  double flops_per_item() const override;
  int64_t items_per_row() const override { return 1; }
  std::string item_name() const override { return "images"; }
  int64_t steps_per_epoch() const override { return grouped_ ? grouped_->steps_per_epoch() : order_->steps_per_epoch(); }
  std::vector<std::string> checkpoint_keys() const override { return {"model.", "diffusion."}; }

  Pipeline& pipeline() { return pipeline_; }
  // buckets.*'s aspect-ratio buckets, which the sets were opened with (none: every image the training square).
  const std::vector<io::ImageSize>& buckets() const { return buckets_; }
  // The UNet is left described for the sharded strategy (memory.strategy zero1, zero2, gemini), which
  // fills its chunks from `weights` (train/lazy_model.h).
  void defer_unet_weights(DeferredWeights weights) { unet_weights_ = std::move(weights); }
  // DreamBooth's prior preservation: each row paired with an image of `classes` (drawn from the seed, step and
  // row), captioned dreambooth.class_prompt, its plain squared error added at dreambooth.prior_loss_weight.
  // With buckets, a row draws among the class images of its step's bucket, else of the bucket holding the most.
  void preserve_prior(std::unique_ptr<io::ImageDataset> classes);
  // LoRA on the text encoder(s) too (`spec`'s layers, adapters drawn from `seed`): each encoder is then a trained
  // model of the run ("text_encoder", "text_encoder_2") and the captions are encoded in the graph.
  void train_text_encoders(const nn::LoraSpec& spec, uint64_t seed);
  // Textual inversion: `tokens` are trained (the concept `token`, whose ids the pipeline's tokenizers hold)
  // and the UNet is frozen beside the text encoder(s) and VAE; each row's caption is one of `templates` (none:
  // its image's own caption) with "{}" read as the token. Before the first step.
  void train_tokens(LearnedTokens tokens, const std::string& token, const std::vector<std::string>& templates);
  // The objective's inputs for items `items` of the training (`train`) or evaluation set with each row's
  // draws; training images are flipped (augment.flip) from `augment_seed` and each item.
  DiffusionInputs inputs(const std::vector<size_t>& items, const std::vector<RowDraws>& draws, bool train, uint64_t augment_seed);

 private:
  // Each item of `set`'s bucket (its index in buckets_; -1 for an unreadable image), all 0 without buckets.
  std::vector<int64_t> groups_of(io::ImageDataset& set) const;
  // The latents' shape [C, h, w] of bucket `group` (without buckets: the training square's).
  std::vector<int64_t> latent_shape(int64_t group) const;
  // The class images a row of a step in bucket `group` draws from (preserve_prior), and their bucket.
  struct ClassPool {
    int64_t group = 0;
    std::vector<size_t> items;
  };
  const ClassPool& class_pool(int64_t group) const;
  // The objective's inputs for items of `set`; in training (`train`) augmented (flips, random crops) from
  // `augment_seed`, and trained text encoded with gradients.
  DiffusionInputs inputs_from(io::ImageDataset& set, bool train, const std::vector<size_t>& items, const std::vector<RowDraws>& draws,
                              uint64_t augment_seed);
  std::vector<std::string> captions_of(const io::ImageTensors& batch, const io::ImageDataset& set) const;
  // The captions of text encoded in the graph: each row's image caption (`images`) or, for textual inversion, its
  // template or image caption with the concept; the empty caption for a dropped one.
  std::vector<std::string> graph_captions(const std::vector<RowDraws>& draws, const std::vector<std::string>& images) const;
  std::string with_token(std::string caption) const;
  std::string trained_name() const { return tokens_ ? "tokens" : "unet"; }
  // Whether the captions are encoded every step with gradients (textual inversion, text-encoder LoRA).
  bool text_in_graph() const { return tokens_ || text_encoder_lora_; }
  // `losses` with the text encoders' entries when their adapters train (lora.text_encoder).
  std::map<std::string, torch::Tensor> with_text_encoders(std::map<std::string, torch::Tensor> losses) const;
  void fill_cache();  // diffusion.cache: every training image's Gaussian and caption encoding, once
  PromptEmbeddings encode_text(const std::vector<std::string>& captions);  // [B, M, D] (SDXL: and [B, P]) in the UNet's dtype

  Pipeline pipeline_;
  SdSettings settings_;
  NoiseSchedule schedule_;
  std::unique_ptr<io::ImageDataset> train_, val_;
  std::unique_ptr<io::ImageDataset> classes_;  // DreamBooth's class images, else null
  std::vector<io::ImageSize> buckets_;           // buckets.* (none: off)
  std::optional<io::EpochOrder> order_;          // without buckets
  std::optional<io::GroupedEpochOrder> grouped_;  // with buckets: each step's images of one bucket
  std::vector<int64_t> train_groups_, val_groups_;  // [N]: each image's bucket (groups_of; all 0 without buckets)
  std::map<int64_t, ClassPool> class_pools_;  // by bucket; -1: for a bucket without class images
  torch::Device device_;
  DeferredWeights unet_weights_;
  LearnedTokens tokens_{nullptr};        // textual inversion's trained rows, else null
  bool text_encoder_lora_ = false;       // the text encoders' adapters train
  std::string token_;                          // the concept's
  std::vector<std::string> concept_captions_;  // the templates with the concept's token (none: the images' captions)
  std::vector<int64_t> latent_shape_;  // [C, h, w] of the training square
  PromptEmbeddings empty_caption_;     // [1, M, D] (SDXL: and [1, P]), the encoding dropped captions get
  std::vector<torch::Tensor> cached_moments_;  // [N] of [2C, h, w] float32 (diffusion.cache; h, w each image's bucket's)
  std::vector<PromptEmbeddings> cached_text_;  // [N] of [M, D] (SDXL: and [P]) (diffusion.cache; none when the text is in the graph)
  std::vector<io::ImagePlacement> cached_placements_;  // [N] (diffusion.cache)
  std::vector<std::string> cached_captions_;           // [N] (diffusion.cache)
};

// The task on `pipeline` with data.*'s training and evaluation sets, opened at the pipeline's resolution or in
// buckets.*'s buckets (a bad buckets.* key is named).
std::unique_ptr<DiffusionTask> make_diffusion_task(const config::Config& config, const SdSettings& settings, Pipeline pipeline,
                                                   const torch::Device& device);

}  // namespace kuafu::sd
