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

  const size_t plane = static_cast<size_t>(transform_.channels) * transform_.size * transform_.size;
  ImageBatch batch;
  batch.pixels.resize(n * plane);
  std::vector<ImagePlacement> placements(n);  // per slot, compacted with the pixels
  const int flags = transform_.channels == 1 ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR;

  // Workers take slots from a shared counter; each writes only its own slot.
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&] {
    for (size_t k = next++; k < n; k = next++) {
      if (outcome[k] == Outcome::kKnownCorrupt) continue;
      try {
        const cv::Mat image = cv::imread(index_.items[items[k]].path, flags);
        if (image.empty()) {
          outcome[k] = Outcome::kCorrupt;
          continue;
        }
        float* out = batch.pixels.data() + k * plane;
        if (train) {
          std::mt19937_64 rng(mix(seed ^ mix(items[k])));
          placements[k] = train_transform(image, transform_, rng, out);
        } else {
          placements[k] = eval_transform(image, transform_, out);
        }
      } catch (const cv::Exception&) {
        outcome[k] = Outcome::kCorrupt;  // some codecs throw on damaged data instead of returning empty
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  const size_t workers = std::min(static_cast<size_t>(threads_), n);
  if (workers <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (size_t w = 0; w < workers; ++w) pool.emplace_back(work);
    for (auto& thread : pool) thread.join();
  }
  if (failure) std::rethrow_exception(failure);

  // Compact the decoded slots to the front, keeping the requested order.
  size_t kept = 0;
  int64_t corrupt_total = 0;
  std::string last_corrupt;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t k = 0; k < n; ++k) {
      const auto& item = index_.items[items[k]];
      if (outcome[k] == Outcome::kOk) {
        if (kept != k) std::copy_n(batch.pixels.begin() + k * plane, plane, batch.pixels.begin() + kept * plane);
        batch.labels.push_back(item.label);
        batch.captions.push_back(item.caption);
        batch.kept.push_back(k);
        batch.placements.push_back(placements[k]);
        ++kept;
        continue;
      }
      batch.skipped.push_back(item.path);
      if (outcome[k] == Outcome::kCorrupt && corrupt_.insert(items[k]).second) {
        log::warnf("skipping unreadable image ", item.path, " (", corrupt_.size(),
                   " so far, data.max_corrupt_images = ", max_corrupt_, ")");
        last_corrupt_ = item.path;
      }
    }
    corrupt_total = static_cast<int64_t>(corrupt_.size());
    last_corrupt = last_corrupt_;
  }
  batch.pixels.resize(kept * plane);
  KUAFU_CHECK(corrupt_total <= max_corrupt_, "too many unreadable images: ", corrupt_total,
              " skipped so far (latest: ", last_corrupt, "), more than the limit of ", max_corrupt_,
              "; fix or remove them, or raise data.max_corrupt_images");
  return batch;
}

}  // namespace kuafu::io
