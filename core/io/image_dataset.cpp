#include "core/io/image_dataset.h"

#include <ATen/Parallel.h>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "core/io/hdf5_images.h"
#include "core/io/idx_file.h"
#include "core/util/device.h"
#include "core/util/error.h"
#ifdef KUAFU_WITH_IMAGE_CODECS
#include "core/io/image_folder.h"
#include "core/io/image_loader.h"
#endif

namespace kuafu::io {
namespace fs = std::filesystem;

namespace {

// Item `item`'s random stream for `seed` (SplitMix64 of both), whatever thread transforms it.
uint64_t item_seed(uint64_t seed, uint64_t item) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + item + 0x632BE59BD9B4E5Bull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Images held in memory as uint8 [N, H, W] or [N, H, W, C] (IDX, HDF5; colour stored as RGB or RGBA).
class ArrayDataset : public ImageDataset {
 public:
  ArrayDataset(ImageArray array, ImageTransform transform, int64_t classes, torch::TensorOptions host)
      : array_(std::move(array)), transform_(std::move(transform)), classes_(classes), host_(host) {}

  int64_t size() const override { return array_.shape[0]; }
  int64_t stored_channels() const override { return array_.shape.size() == 4 ? array_.shape[3] : 1; }
  std::vector<std::string> class_names() const override {
    std::vector<std::string> names;
    for (int64_t c = 0; c < classes_; ++c) names.push_back(std::to_string(c));
    return names;
  }

  std::vector<ImageSize> image_sizes() override {
    return std::vector<ImageSize>(static_cast<size_t>(size()), ImageSize{array_.shape[1], array_.shape[2]});
  }

  ImageTensors batch(const std::vector<size_t>& items, bool train, uint64_t seed) override {
    const int64_t height = array_.shape[1], width = array_.shape[2], channels = stored_channels();
    const ImageSize out_size = output_size(transform_, {height, width});  // every stored image's size is the same
    const int64_t n = static_cast<int64_t>(items.size()), c = transform_.channels;
    torch::Tensor pixels = torch::empty({n, c, out_size.height, out_size.width}, host_.dtype(torch::kFloat32));
    torch::Tensor labels = torch::empty({n}, host_.dtype(torch::kInt64));
    const size_t image_bytes = static_cast<size_t>(height * width * channels);
    float* out = pixels.data_ptr<float>();
    int64_t* label_out = labels.data_ptr<int64_t>();
    for (size_t item : items) {
      KUAFU_CHECK(item < static_cast<size_t>(size()), "image ", item, " is out of range (", size(), " images)");
    }
    std::vector<ImagePlacement> placements(items.size());
    at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const size_t item = items[static_cast<size_t>(k)];
        const cv::Mat stored(static_cast<int>(height), static_cast<int>(width), CV_8UC(static_cast<int>(channels)),
                             const_cast<uint8_t*>(array_.pixels.data() + item * image_bytes));
        cv::Mat image = stored;  // the transforms take OpenCV's order
        if (channels == 3) cv::cvtColor(stored, image, cv::COLOR_RGB2BGR);
        if (channels == 4) cv::cvtColor(stored, image, cv::COLOR_RGBA2BGRA);
        float* target = out + k * c * out_size.height * out_size.width;
        const auto row = static_cast<size_t>(k);
        if (train) {
          std::mt19937_64 rng(item_seed(seed, item));
          placements[row] = train_transform(image, transform_, rng, target);
        } else {
          placements[row] = eval_transform(image, transform_, target);
        }
        label_out[k] = array_.labels[item];
      }
    });
    std::vector<std::optional<std::string>> captions(items.size());
    if (!array_.captions.empty()) {
      for (size_t k = 0; k < items.size(); ++k) captions[k] = array_.captions[items[k]];
    }
    std::vector<size_t> kept(items.size());
    std::iota(kept.begin(), kept.end(), size_t{0});
    return {pixels, labels, std::move(captions), std::move(kept), std::move(placements)};
  }

 private:
  ImageArray array_;
  ImageTransform transform_;
  int64_t classes_;
  torch::TensorOptions host_;
};

#ifdef KUAFU_WITH_IMAGE_CODECS
class FolderDataset : public ImageDataset {
 public:
  FolderDataset(ImageFolderIndex index, ImageTransform transform, int threads, int64_t max_corrupt,
                torch::TensorOptions host)
      : loader_(std::move(index), std::move(transform), threads, max_corrupt), host_(host) {}
  int64_t size() const override { return static_cast<int64_t>(loader_.size()); }
  int64_t stored_channels() const override { return 0; }
  std::vector<std::string> class_names() const override { return loader_.index().classes; }
  std::vector<ImageSize> image_sizes() override { return loader_.image_sizes(); }
  ImageTensors batch(const std::vector<size_t>& items, bool train, uint64_t seed) override {
    ImageBatch decoded = loader_.load(items, train, seed);
    const int64_t n = static_cast<int64_t>(decoded.labels.size());
    torch::Tensor pixels = torch::empty({n, loader_.transform().channels, decoded.height, decoded.width}, host_.dtype(torch::kFloat32));
    pixels.copy_(torch::from_blob(decoded.pixels.data(), pixels.sizes()));
    torch::Tensor labels = torch::empty({n}, host_.dtype(torch::kInt64));
    labels.copy_(torch::from_blob(decoded.labels.data(), {n}, torch::kInt64));
    return {pixels, labels, std::move(decoded.captions), std::move(decoded.kept), std::move(decoded.placements)};
  }

 private:
  ImageFolderLoader loader_;
  torch::TensorOptions host_;
};
#endif

// The IDX pair <prefix>-images-idx3-ubyte.gz (images [N, H, W]) and <prefix>-labels-idx1-ubyte.gz ([N]).
ImageArray read_idx_images(const std::string& prefix) {
  const std::string images_path = prefix + "-images-idx3-ubyte.gz", labels_path = prefix + "-labels-idx1-ubyte.gz";
  for (const std::string& path : {images_path, labels_path}) {
    KUAFU_CHECK(fs::exists(path), "IDX file ", path, " does not exist (the images and labels of prefix ", prefix, ")");
  }
  IdxArray images = read_idx(images_path);
  const IdxArray labels = read_idx(labels_path);
  KUAFU_CHECK(images.shape.size() == 3 && labels.shape.size() == 1 && labels.shape[0] == images.shape[0], "IDX files ",
              images_path, " and ", labels_path, " do not hold images [N, H, W] and labels [N] of the same N");
  return {images.shape, std::move(images.data), std::vector<int64_t>(labels.data.begin(), labels.data.end()), {}};
}

// The number of classes of `labels`: `classes` when given (every label must lie below it), else the
// largest label + 1.
int64_t check_labels(const std::string& path, const std::vector<int64_t>& labels, int64_t classes) {
  const int64_t largest = labels.empty() ? -1 : *std::max_element(labels.begin(), labels.end());
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || (classes > 0 && labels[i] >= classes)) {
      fail(detail::concat("image set ", path, ": label ", labels[i], " of image ", i, " is ",
                          labels[i] < 0 ? "negative" : "outside [0, " + std::to_string(classes) + ")"));
    }
  }
  return classes > 0 ? classes : largest + 1;
}

}  // namespace

ImageTensors batch_replacing_unreadable(ImageDataset& set, const std::vector<size_t>& items, bool train, uint64_t seed) {
  ImageTensors batch = set.batch(items, train, seed);
  if (batch.kept.size() == items.size()) return batch;
  // Row i of the result: the decoded row of position i, or the first readable image after items[i].
  std::vector<int64_t> row_of(items.size(), -1);
  for (size_t r = 0; r < batch.kept.size(); ++r) row_of[batch.kept[r]] = static_cast<int64_t>(r);
  std::vector<torch::Tensor> pixels, labels;
  std::vector<std::optional<std::string>> captions;
  std::vector<ImagePlacement> placements;
  const auto size = static_cast<size_t>(set.size());
  // Replacements take the batch's image shape [C, H, W] (its aspect bucket, where the set has buckets).
  std::vector<int64_t> shape;
  if (!batch.kept.empty()) shape = batch.pixels[0].sizes().vec();
  for (size_t i = 0; i < items.size(); ++i) {
    if (row_of[i] >= 0) {
      pixels.push_back(batch.pixels[row_of[i]]);
      labels.push_back(batch.labels[row_of[i]]);
      captions.push_back(batch.captions[static_cast<size_t>(row_of[i])]);
      placements.push_back(batch.placements[static_cast<size_t>(row_of[i])]);
      continue;
    }
    ImageTensors replacement;
    const auto fits = [&shape](const ImageTensors& r) { return !r.kept.empty() && (shape.empty() || r.pixels[0].sizes().vec() == shape); };
    for (size_t next = (items[i] + 1) % size; !fits(replacement); next = (next + 1) % size) {
      KUAFU_CHECK(next != items[i], "no image of the set could be read in this batch's shape ", shape);  // the loader's limit stops this first
      replacement = set.batch({next}, train, seed);
    }
    if (shape.empty()) shape = replacement.pixels[0].sizes().vec();
    pixels.push_back(replacement.pixels[0]);
    labels.push_back(replacement.labels[0]);
    captions.push_back(replacement.captions[0]);
    placements.push_back(replacement.placements[0]);
  }
  std::vector<size_t> all(items.size());
  std::iota(all.begin(), all.end(), size_t{0});
  return {torch::stack(pixels), torch::stack(labels), std::move(captions), std::move(all), std::move(placements)};
}

std::unique_ptr<ImageDataset> open_image_dataset(const ImageSetSpec& spec, const torch::Device& device) {
  check_transform(spec.transform);
  if (spec.format == "folder") {
#ifdef KUAFU_WITH_IMAGE_CODECS
    ImageFolderIndex index = spec.classes.empty() ? scan_image_folder(spec.path) : scan_image_folder(spec.path, spec.classes);
    const int threads = spec.threads > 0 ? spec.threads : std::max(1, torch::get_num_threads());
    return std::make_unique<FolderDataset>(std::move(index), spec.transform, threads, spec.max_corrupt_images,
                                           host_staging_options(device));
#else
    fail("image folder " + spec.path + ": this build has no image decoding (KUAFU_WITH_IMAGE_CODECS=OFF)");
#endif
  }
  KUAFU_CHECK(spec.format == "idx" || spec.format == "hdf5", "image set ", spec.path, ": unknown format '", spec.format,
              "' (expected idx, folder or hdf5)");
  ImageArray array = spec.format == "idx"
                         ? read_idx_images(spec.path)
                         : read_hdf5_images(spec.path, spec.hdf5_images, spec.hdf5_labels, spec.hdf5_captions);
  const int64_t channels = array.shape.size() == 4 ? array.shape[3] : 1;
  KUAFU_CHECK(channels == 1 || channels == 3 || channels == 4, "image set ", spec.path, ": images of ", channels,
              " channels (expected 1, 3 or 4)");
  const int64_t classes = check_labels(spec.path, array.labels, spec.num_classes);
  return std::make_unique<ArrayDataset>(std::move(array), spec.transform, classes, host_staging_options(device));
}

}  // namespace kuafu::io
