// The image sets kuafu-vit trains and evaluates on, as tensors: IDX and HDF5 arrays held in memory,
// or image folders decoded on worker threads; each with the training or evaluation transform.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "apps/vit/model.h"
#include "core/config/config.h"

namespace kuafu::vit {

struct ImageBatch {
  torch::Tensor pixels;  // [n, C, S, S] float32, normalised
  torch::Tensor labels;  // [n] int64 (n may be short of the request when unreadable images were skipped)
};

class ImageDataset {
 public:
  virtual ~ImageDataset() = default;
  virtual int64_t size() const = 0;
  // Items `items`, augmented (from `seed` and each item's index) when `train`, else centre-cropped.
  virtual ImageBatch batch(const std::vector<size_t>& items, bool train, uint64_t seed) = 0;
  // Class names when the set has them (folders), else "0", "1", ...
  virtual std::vector<std::string> class_names() const = 0;
};

// The training (`train`) or evaluation set of the config's data.* keys, transformed to the model's
// input. Fails naming the key when a file or folder is missing, a label is out of range or the images'
// channels do not match model.num_channels. Batches are made in host memory that copies fast to
// `device` (page-locked for a GPU).
std::unique_ptr<ImageDataset> open_dataset(const config::Config& config, const ViTConfig& model, bool train,
                                           const torch::Device& device = torch::kCPU);

}  // namespace kuafu::vit
