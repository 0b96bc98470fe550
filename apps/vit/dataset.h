// The image sets kuafu-vit trains and evaluates on: core/io's image sets (io::open_image_dataset) as
// the config's data.* and augment.* keys describe them, checked against the model's channels and classes.
#pragma once

#include <memory>

#include "apps/vit/model.h"
#include "core/config/config.h"
#include "core/io/image_dataset.h"

namespace kuafu::vit {

// The training (`train`) or evaluation set of the config's data.* keys, transformed to the model's
// input. Fails naming the key when a file or folder is missing or malformed, a label is out of range or
// the images' channels do not match model.num_channels. Batches are made in host memory that copies
// fast to `device` (page-locked for a GPU).
std::unique_ptr<io::ImageDataset> open_dataset(const config::Config& config, const ViTConfig& model, bool train,
                                               const torch::Device& device = torch::kCPU);

}  // namespace kuafu::vit
