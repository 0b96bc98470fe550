// Image sets as tensors for training and evaluation: IDX and HDF5 arrays held in memory, or image
// folders decoded on worker threads; each image with its label and, where the set has one, a caption.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/io/image_augment.h"

namespace kuafu::io {

// Where a set's images are and how they become a model's input.
struct ImageSetSpec {
  std::string format = "idx";  // idx, folder or hdf5
  // idx: the prefix of <path>-images-idx3-ubyte.gz and <path>-labels-idx1-ubyte.gz; folder: the root of
  // <class>/.../<image> (captions: <image>.txt beside it); hdf5: the file.
  std::string path;
  std::vector<std::string> classes;  // folder: the class list that labels it (the training set's); empty: its own
  std::string hdf5_images = "images", hdf5_labels = "labels", hdf5_captions = "captions";  // dataset names
  // idx, hdf5: labels must lie in [0, num_classes), named "0", "1", ...; 0 = the largest label + 1.
  int64_t num_classes = 0;
  int threads = 0;                 // folder: decoding threads; 0 = torch::get_num_threads()
  int64_t max_corrupt_images = 0;  // folder: unreadable images skipped (and reported) before loading fails
  ImageTransform transform;        // the output's size, channels, augmentation and normalisation
};

struct ImageTensors {
  torch::Tensor pixels;  // [n, C, H, W] float32, normalised (H = W = the transform's size, or the images' aspect bucket)
  torch::Tensor labels;  // [n] int64 (n may be short of the request when unreadable images were skipped)
  std::vector<std::optional<std::string>> captions;  // [n]: each image's caption, when it has one
  std::vector<size_t> kept;  // [n]: each row's position among the requested items (0..n-1 when none was skipped)
  std::vector<ImagePlacement> placements;  // [n]: each row's source size and crop (SDXL's micro-conditioning)
};

class ImageDataset {
 public:
  virtual ~ImageDataset() = default;
  virtual int64_t size() const = 0;
  // Channels stored per image (1, 3 or 4) for arrays; 0 for folders, decoded to the transform's.
  virtual int64_t stored_channels() const = 0;
  // Items `items`, augmented (from `seed` and each item's index) when `train`, else centre-cropped. With
  // aspect-ratio buckets (transform.buckets) the items must share one (kuafu::Error otherwise).
  virtual ImageTensors batch(const std::vector<size_t>& items, bool train, uint64_t seed) = 0;
  // Every image's size as decoded, {0, 0} for an unreadable one (a folder decodes all once to know them).
  virtual std::vector<ImageSize> image_sizes() = 0;
  // Class names: a folder's class list, else "0", "1", ...
  virtual std::vector<std::string> class_names() const = 0;
};

// The images of `items`, one row each (kept = 0..n-1): an unreadable image (skipped and counted by a
// folder's loader, up to data.max_corrupt_images) is replaced by the next readable one of the set (of the
// same aspect bucket), so
// that each row keeps the draws made for it, a micro-batch its size and a cache its order.
ImageTensors batch_replacing_unreadable(ImageDataset& set, const std::vector<size_t>& items, bool train, uint64_t seed);

// Opens the set. Throws kuafu::Error naming the file or folder when it is missing or malformed, when
// a label lies outside [0, spec.num_classes) or when the transform is invalid. Batches are made in host
// memory that copies fast to `device` (page-locked for a GPU).
std::unique_ptr<ImageDataset> open_image_dataset(const ImageSetSpec& spec, const torch::Device& device = torch::kCPU);

}  // namespace kuafu::io
