#include "apps/vit/app_config.h"

#include <optional>

#include "apps/vit/hugging_face.h"
#include "core/train/benchmark.h"
#include "core/train/hf_interop.h"
#include "core/train/runtime.h"
#include "core/train/trainer.h"

namespace kuafu::vit {

config::Schema vit_schema() {
  config::Schema s;
  train::add_runtime_schema(s);
  train::add_trainer_schema(s);
  // The upper bounds only stop absurd values early; check_model_fits judges what this machine holds.
  s.add_int("model.image_size", 224, "input side in pixels (square)").min(1).max(1 << 14);
  s.add_int("model.patch_size", 16, "patch side in pixels (must divide model.image_size)").min(1);
  s.add_int("model.num_channels", 3, "input channels: 3 (RGB) or 1 (gray)").min(1).max(3);
  s.add_int("model.hidden_size", 768, "hidden size H").min(1).max(1 << 18);
  s.add_int("model.num_hidden_layers", 12, "transformer blocks").min(1).max(100000);
  s.add_int("model.num_attention_heads", 12, "attention heads (must divide model.hidden_size)").min(1).max(1 << 12);
  s.add_int("model.intermediate_size", 3072, "MLP hidden size").min(1).max(1 << 20);
  s.add_int("model.num_labels", 1000, "classes").min(2).max(1 << 24);
  s.add_float("model.hidden_dropout_prob", 0.0, "dropout on embeddings and residual branches").min(0).max(0.9);
  s.add_float("model.attention_probs_dropout_prob", 0.0, "dropout on attention probabilities").min(0).max(0.9);
  s.add_float("model.layer_norm_eps", 1e-12, "LayerNorm epsilon").min(0);

  s.add_string("data.format", "idx", "idx (MNIST-style files, gzip read directly), folder (one sub-folder per class, "
                                     "JPEG/PNG) or hdf5 (uint8 images and integer labels)")
      .choices({"idx", "folder", "hdf5"});
  s.add_string("data.train", "/usr/share/datasets/fashion-mnist/train",
               "idx: path prefix of <prefix>-images-idx3-ubyte.gz and <prefix>-labels-idx1-ubyte.gz; folder: the "
               "training folder; hdf5: the training file");
  s.add_string("data.val", "/usr/share/datasets/fashion-mnist/t10k", "the same for the evaluation set");
  s.add_string("data.hdf5_images", "images", "hdf5: dataset of uint8 images [N, H, W] or [N, H, W, C]");
  s.add_string("data.hdf5_labels", "labels", "hdf5: dataset of integer labels [N]");
  s.add_int("data.workers", 0, "image decoding threads per rank; 0 = runtime.threads").min(0);
  s.add_int("data.max_corrupt_images", 100, "unreadable images skipped (and reported) before the run fails").min(0);
  s.add_float_list("data.mean", {0.5}, "per-channel normalisation mean (one value for every channel, or one each)");
  s.add_float_list("data.std", {0.5}, "per-channel normalisation standard deviation");

  s.add_float("augment.scale_min", 0.08, "random-resized crop: smallest area fraction (1 = no crop)").min(0.01).max(1);
  s.add_bool("augment.flip", true, "random horizontal flips");
  s.add_float("augment.eval_resize_ratio", 0.875, "evaluation: crop side / resized shorter side (1 = no zoom)")
      .min(0.1).max(1);
  s.add_float("augment.label_smoothing", 0.1, "ε: 1 − ε on the label, ε spread over the classes").min(0).max(0.5);
  s.add_float("augment.mixup", 0.0, "mixup α (Beta(α, α) mixing of image pairs); 0 = off").min(0).max(10);

  train::add_benchmark_schema(s);
  train::add_hf_schema(s);
  s.add_bool("model.new_classifier", false,
             "with model.init_from: start the classifier afresh for model.num_labels classes (a backbone-only "
             "folder, or another task's labels)");
  return s;
}

ViTConfig model_config(const config::Config& config) {
  if (std::optional<ViTConfig> from_folder = vit_format().init_config(config)) {
    // The folder gives the shape; a fine-tune may change the dropout and, with a new classifier, the classes.
    ViTConfig& m = *from_folder;
    const std::string folder = train::init_from(config);
    if (config.is_set("model.num_labels") && config.get_int("model.num_labels") != m.num_labels) {
      if (!config.get_bool("model.new_classifier")) {
        config.fail_at("model.num_labels", "is " + std::to_string(config.get_int("model.num_labels")) + " but " + folder +
                                               " classifies " + std::to_string(m.num_labels) +
                                               " labels; set model.new_classifier = true to train a new head");
      }
      m.num_labels = config.get_int("model.num_labels");
    }
    return m;
  }
  ViTConfig m;
  vit_format().numbers.read_config(config, m);
  m.num_labels = config.get_int("model.num_labels");
  if (m.image_size % m.patch_size != 0) {
    config.fail_at("model.patch_size", "(" + std::to_string(m.patch_size) + ") must divide model.image_size (" +
                                           std::to_string(m.image_size) + ")");
  }
  if (m.hidden_size % m.num_attention_heads != 0) {
    config.fail_at("model.num_attention_heads", "(" + std::to_string(m.num_attention_heads) +
                                                    ") must divide model.hidden_size (" + std::to_string(m.hidden_size) + ")");
  }
  return m;
}

}  // namespace kuafu::vit
