// Decodes and transforms batches of an image folder on worker threads. Unreadable images are
// skipped and reported once; past a limit (data.max_corrupt_images) loading fails.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/io/image_augment.h"
#include "core/io/image_folder.h"

namespace kuafu::io {

struct ImageBatch {
  std::vector<float> pixels;         // [n, channels, height, width], n = labels.size()
  int64_t height = 0, width = 0;     // the images' output size (transform.size, or their aspect bucket)
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
  // With aspect-ratio buckets (transform.buckets), kuafu::Error when the decoded images fall in different buckets.
  ImageBatch load(const std::vector<size_t>& items, bool train, uint64_t seed);
  // Every item's size as decoded ({0, 0} for an unreadable one, counted as load counts it), decoding the whole
  // folder once on the loader's threads; then kept.
  const std::vector<ImageSize>& image_sizes();

  const ImageFolderIndex& index() const { return index_; }
  const ImageTransform& transform() const { return transform_; }
  size_t size() const { return index_.items.size(); }
  int64_t corrupt_count() const;

 private:
  // work(k) for every k in [0, n) on up to `threads_` threads; the first exception is rethrown.
  void on_threads(size_t n, const std::function<void(size_t)>& work) const;
  // Records item `item` as unreadable (warned once); kuafu::Error past max_corrupt_.
  void count_unreadable(size_t item);
  void check_corrupt_limit() const;

  ImageFolderIndex index_;
  ImageTransform transform_;
  int threads_;
  int64_t max_corrupt_;
  mutable std::mutex mutex_;  // guards corrupt_ and last_corrupt_
  std::set<size_t> corrupt_;  // items known to be unreadable: not decoded again, not warned again
  std::string last_corrupt_;
  std::vector<ImageSize> sizes_;  // image_sizes(), once read
};

}  // namespace kuafu::io
