// Decodes and transforms batches of an image folder on worker threads. Unreadable images are
// skipped and reported once; past a limit (data.max_corrupt_images) loading fails.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/io/image_augment.h"
#include "core/io/image_folder.h"

namespace kuafu::io {

struct ImageBatch {
  std::vector<float> pixels;         // [n, channels, size, size], n = labels.size()
  std::vector<int64_t> labels;       // [n]
  std::vector<std::optional<std::string>> captions;  // [n]: each image's caption, when it has one
  std::vector<size_t> kept;          // [n]: each decoded image's position among the requested items
  std::vector<ImagePlacement> placements;  // [n]: each image's source size and crop
  std::vector<std::string> skipped;  // paths of requested images that could not be decoded
};

class ImageFolderLoader {
 public:
  // `threads` <= 1 decodes on the calling thread. `max_corrupt`: distinct unreadable images the
  // loader tolerates over its lifetime. Throws kuafu::Error for a bad transform.
  ImageFolderLoader(ImageFolderIndex index, ImageTransform transform, int threads, int64_t max_corrupt);

  // Decodes index.items[i] for each i in `items` (in order, minus skipped ones), with the training
  // transform when `train`, else the eval one. Item i's augmentation depends only on (seed, i), not
  // on the thread count or its position in the batch. Throws kuafu::Error for an item index out of
  // range, or once more than max_corrupt distinct images have proved unreadable.
  ImageBatch load(const std::vector<size_t>& items, bool train, uint64_t seed);

  const ImageFolderIndex& index() const { return index_; }
  const ImageTransform& transform() const { return transform_; }
  size_t size() const { return index_.items.size(); }
  int64_t corrupt_count() const;

 private:
  ImageFolderIndex index_;
  ImageTransform transform_;
  int threads_;
  int64_t max_corrupt_;
  mutable std::mutex mutex_;  // guards corrupt_ and last_corrupt_
  std::set<size_t> corrupt_;  // items known to be unreadable: not decoded again, not warned again
  std::string last_corrupt_;
};

}  // namespace kuafu::io
