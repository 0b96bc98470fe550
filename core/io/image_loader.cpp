#include "core/io/image_loader.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <opencv2/imgcodecs.hpp>
#include <thread>
#include <utility>

#include "core/util/error.h"
#include "core/util/logging.h"

namespace kuafu::io {
namespace {

// splitmix64: turns (seed, item) into well-spread, independent RNG seeds.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

enum class Outcome : uint8_t { kOk, kCorrupt, kKnownCorrupt };

}  // namespace

ImageFolderLoader::ImageFolderLoader(ImageFolderIndex index, ImageTransform transform, int threads, int64_t max_corrupt)
    : index_(std::move(index)),
      transform_(std::move(transform)),
      threads_(std::max(threads, 1)),
      max_corrupt_(max_corrupt) {
  check_transform(transform_);
  KUAFU_CHECK(max_corrupt_ >= 0, "data.max_corrupt_images must be >= 0, found ", max_corrupt_);
}

int64_t ImageFolderLoader::corrupt_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(corrupt_.size());
}

void ImageFolderLoader::on_threads(size_t n, const std::function<void(size_t)>& work) const {
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto worker = [&] {
    for (size_t k = next++; k < n; k = next++) {
      try {
        work(k);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  const size_t workers = std::min(static_cast<size_t>(threads_), n);
  if (workers <= 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    for (size_t w = 0; w < workers; ++w) pool.emplace_back(worker);
    for (auto& thread : pool) thread.join();
  }
  if (failure) std::rethrow_exception(failure);
}

void ImageFolderLoader::count_unreadable(size_t item) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!corrupt_.insert(item).second) return;
  last_corrupt_ = index_.items[item].path;
  log::warnf("skipping unreadable image ", last_corrupt_, " (", corrupt_.size(), " so far, data.max_corrupt_images = ", max_corrupt_, ")");
}

void ImageFolderLoader::check_corrupt_limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  KUAFU_CHECK(static_cast<int64_t>(corrupt_.size()) <= max_corrupt_, "too many unreadable images: ", corrupt_.size(),
              " skipped so far (latest: ", last_corrupt_, "), more than the limit of ", max_corrupt_,
              "; fix or remove them, or raise data.max_corrupt_images");
}

const std::vector<ImageSize>& ImageFolderLoader::image_sizes() {
  if (!sizes_.empty() || index_.items.empty()) return sizes_;
  std::vector<ImageSize> sizes(index_.items.size());
  std::vector<uint8_t> unreadable(sizes.size(), 0);
  const int flags = transform_.channels == 1 ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR;
  on_threads(sizes.size(), [&](size_t k) {
    try {
      const cv::Mat image = cv::imread(index_.items[k].path, flags);
      if (!image.empty()) sizes[k] = {image.rows, image.cols};
    } catch (const cv::Exception&) {  // some codecs throw on damaged data instead of returning empty
    }
    unreadable[k] = sizes[k].height == 0;
  });
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (unreadable[k]) count_unreadable(k);
  }
  check_corrupt_limit();
  sizes_ = std::move(sizes);
  return sizes_;
}

ImageBatch ImageFolderLoader::load(const std::vector<size_t>& items, bool train, uint64_t seed) {
  const size_t n = items.size();
  std::vector<Outcome> outcome(n, Outcome::kOk);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t k = 0; k < n; ++k) {
      KUAFU_CHECK(items[k] < index_.items.size(), "image loader: item ", items[k], " is out of range (",
                  index_.items.size(), " images)");
      if (corrupt_.count(items[k])) outcome[k] = Outcome::kKnownCorrupt;
    }
  }

  // Each slot decodes into its own buffer: with aspect-ratio buckets, its size is known only once decoded.
  std::vector<std::vector<float>> pixels(n);
  std::vector<ImageSize> sizes(n);
  std::vector<ImagePlacement> placements(n);
  const int flags = transform_.channels == 1 ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR;
  on_threads(n, [&](size_t k) {
    if (outcome[k] == Outcome::kKnownCorrupt) return;
    try {
      const cv::Mat image = cv::imread(index_.items[items[k]].path, flags);
      if (image.empty()) {
        outcome[k] = Outcome::kCorrupt;
        return;
      }
      sizes[k] = output_size(transform_, {image.rows, image.cols});
      pixels[k].resize(static_cast<size_t>(transform_.channels * sizes[k].height * sizes[k].width));
      if (train) {
        std::mt19937_64 rng(mix(seed ^ mix(items[k])));
        placements[k] = train_transform(image, transform_, rng, pixels[k].data());
      } else {
        placements[k] = eval_transform(image, transform_, pixels[k].data());
      }
    } catch (const cv::Exception&) {
      outcome[k] = Outcome::kCorrupt;  // some codecs throw on damaged data instead of returning empty
    }
  });

  // The decoded slots in the requested order.
  ImageBatch batch;
  for (size_t k = 0; k < n; ++k) {
    const auto& item = index_.items[items[k]];
    if (outcome[k] != Outcome::kOk) {
      batch.skipped.push_back(item.path);
      if (outcome[k] == Outcome::kCorrupt) count_unreadable(items[k]);
      continue;
    }
    if (batch.kept.empty()) {
      batch.height = sizes[k].height;
      batch.width = sizes[k].width;
    }
    KUAFU_CHECK((sizes[k] == ImageSize{batch.height, batch.width}), "image loader: ", item.path, " falls in the ", sizes[k].width, "x",
                sizes[k].height, " aspect bucket, ", index_.items[items[batch.kept.front()]].path, " of the same batch in the ",
                batch.width, "x", batch.height, " one; a batch's images must share one");
    batch.pixels.insert(batch.pixels.end(), pixels[k].begin(), pixels[k].end());
    batch.labels.push_back(item.label);
    batch.captions.push_back(item.caption);
    batch.kept.push_back(k);
    batch.placements.push_back(placements[k]);
  }
  if (batch.kept.empty()) {
    batch.height = transform_.size;
    batch.width = transform_.size;
  }
  check_corrupt_limit();
  return batch;
}

}  // namespace kuafu::io
