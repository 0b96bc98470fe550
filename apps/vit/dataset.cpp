#include "apps/vit/dataset.h"

#include <ATen/Parallel.h>
#include <opencv2/imgproc.hpp>

#include <filesystem>

#include "core/io/hdf5_images.h"
#include "core/io/idx_file.h"
#include "core/io/image_augment.h"
#include "core/util/device.h"
#include "core/util/error.h"
#ifdef KUAFU_WITH_IMAGE_CODECS
#include "core/io/image_folder.h"
#include "core/io/image_loader.h"
#endif

namespace kuafu::vit {
namespace fs = std::filesystem;

namespace {

// Item `item`'s random stream for `seed` (SplitMix64 of both), whatever thread transforms it.
uint64_t item_seed(uint64_t seed, uint64_t item) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + item + 0x632BE59BD9B4E5Bull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<std::string> numbered_classes(int64_t count) {
  std::vector<std::string> names;
  for (int64_t c = 0; c < count; ++c) names.push_back(std::to_string(c));
  return names;
}

// Images held in memory as uint8 [N, H, W] or [N, H, W, C] (IDX, HDF5; 3 channels stored as RGB).
class ArrayDataset : public ImageDataset {
 public:
  ArrayDataset(std::vector<int64_t> shape, std::vector<uint8_t> pixels, std::vector<int64_t> labels,
               io::ImageTransform transform, int64_t classes, torch::TensorOptions host)
      : shape_(std::move(shape)), pixels_(std::move(pixels)), labels_(std::move(labels)),
        transform_(std::move(transform)), classes_(classes), host_(host) {}

  int64_t size() const override { return shape_[0]; }
  std::vector<std::string> class_names() const override { return numbered_classes(classes_); }

  ImageBatch batch(const std::vector<size_t>& items, bool train, uint64_t seed) override {
    const int64_t n = static_cast<int64_t>(items.size()), s = transform_.size, c = transform_.channels;
    torch::Tensor pixels = torch::empty({n, c, s, s}, host_.dtype(torch::kFloat32));
    torch::Tensor labels = torch::empty({n}, host_.dtype(torch::kInt64));
    const int64_t height = shape_[1], width = shape_[2], channels = shape_.size() == 4 ? shape_[3] : 1;
    const size_t image_bytes = static_cast<size_t>(height * width * channels);
    float* out = pixels.data_ptr<float>();
    int64_t* label_out = labels.data_ptr<int64_t>();
    at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const size_t item = items[static_cast<size_t>(k)];
        KUAFU_CHECK(item < static_cast<size_t>(size()), "image ", item, " is out of range (", size(), " images)");
        const cv::Mat stored(static_cast<int>(height), static_cast<int>(width), CV_8UC(static_cast<int>(channels)),
                             const_cast<uint8_t*>(pixels_.data() + item * image_bytes));
        cv::Mat image = stored;
        if (channels == 3) cv::cvtColor(stored, image, cv::COLOR_RGB2BGR);  // the transforms take OpenCV's order
        float* target = out + k * c * s * s;
        if (train) {
          std::mt19937_64 rng(item_seed(seed, item));
          io::train_transform(image, transform_, rng, target);
        } else {
          io::eval_transform(image, transform_, target);
        }
        label_out[k] = labels_[item];
      }
    });
    return {pixels, labels};
  }

 private:
  std::vector<int64_t> shape_;
  std::vector<uint8_t> pixels_;
  std::vector<int64_t> labels_;
  io::ImageTransform transform_;
  int64_t classes_;
  torch::TensorOptions host_;
};

#ifdef KUAFU_WITH_IMAGE_CODECS
class FolderDataset : public ImageDataset {
 public:
  FolderDataset(io::ImageFolderIndex index, io::ImageTransform transform, int threads, int64_t max_corrupt,
                torch::TensorOptions host)
      : loader_(std::move(index), std::move(transform), threads, max_corrupt), host_(host) {}
  int64_t size() const override { return static_cast<int64_t>(loader_.size()); }
  std::vector<std::string> class_names() const override { return loader_.index().classes; }
  ImageBatch batch(const std::vector<size_t>& items, bool train, uint64_t seed) override {
    io::ImageBatch decoded = loader_.load(items, train, seed);
    const int64_t n = static_cast<int64_t>(decoded.labels.size()), s = loader_.transform().size;
    torch::Tensor pixels = torch::empty({n, loader_.transform().channels, s, s}, host_.dtype(torch::kFloat32));
    pixels.copy_(torch::from_blob(decoded.pixels.data(), pixels.sizes()));
    torch::Tensor labels = torch::empty({n}, host_.dtype(torch::kInt64));
    labels.copy_(torch::from_blob(decoded.labels.data(), {n}, torch::kInt64));
    return {pixels, labels};
  }

 private:
  io::ImageFolderLoader loader_;
  torch::TensorOptions host_;
};
#endif

io::ImageTransform transform_of(const config::Config& config, const ViTConfig& model) {
  io::ImageTransform t;
  t.size = static_cast<int>(model.image_size);
  t.channels = static_cast<int>(model.num_channels);
  t.scale_min = config.get_float("augment.scale_min");
  t.flip = config.get_bool("augment.flip");
  t.resize_ratio = config.get_float("augment.eval_resize_ratio");
  t.mean.clear();
  t.std.clear();
  const auto mean = config.get_float_list("data.mean"), std = config.get_float_list("data.std");
  for (const auto& [key, values] : {std::pair{"data.mean", mean}, std::pair{"data.std", std}}) {
    if (values.size() != 1 && values.size() != static_cast<size_t>(t.channels)) {
      config.fail_at(key, "has " + std::to_string(values.size()) + " values; give 1 or model.num_channels = " +
                              std::to_string(t.channels));
    }
  }
  for (int c = 0; c < t.channels; ++c) {
    t.mean.push_back(static_cast<float>(mean[mean.size() == 1 ? 0 : c]));
    t.std.push_back(static_cast<float>(std[std.size() == 1 ? 0 : c]));
  }
  io::check_transform(t);
  return t;
}

void check_labels(const config::Config& config, const std::string& key, const std::vector<int64_t>& labels,
                  int64_t classes) {
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || labels[i] >= classes) {
      config.fail_at(key, "label " + std::to_string(labels[i]) + " of image " + std::to_string(i) +
                              " is outside [0, model.num_labels = " + std::to_string(classes) + ")");
    }
  }
}

}  // namespace

std::unique_ptr<ImageDataset> open_dataset(const config::Config& config, const ViTConfig& model, bool train,
                                           const torch::Device& device) {
  const std::string key = train ? "data.train" : "data.val";
  const std::string path = config.get_string(key);
  const std::string format = config.get_string("data.format");
  const io::ImageTransform transform = transform_of(config, model);
  std::vector<int64_t> shape, labels;
  std::vector<uint8_t> pixels;
  if (format == "folder") {
#ifdef KUAFU_WITH_IMAGE_CODECS
    if (!fs::is_directory(path)) config.fail_at(key, "= " + path + " is not a folder");
    io::ImageFolderIndex index = train ? io::scan_image_folder(path)
                                       : io::scan_image_folder(path, io::scan_image_folder(config.get_string("data.train")).classes);
    if (static_cast<int64_t>(index.classes.size()) != model.num_labels) {
      config.fail_at("model.num_labels", "is " + std::to_string(model.num_labels) + " but " + path + " has " +
                                             std::to_string(index.classes.size()) + " class folders");
    }
    const int64_t workers = config.get_int("data.workers");
    const int threads = static_cast<int>(workers > 0 ? workers : std::max(1, torch::get_num_threads()));
    return std::make_unique<FolderDataset>(std::move(index), transform, threads, config.get_int("data.max_corrupt_images"),
                                           host_staging_options(device));
#else
    config.fail_at("data.format", "is \"folder\" but this build has no image decoding (KUAFU_WITH_IMAGE_CODECS=OFF)");
#endif
  }
  if (format == "idx") {
    for (const char* suffix : {"-images-idx3-ubyte.gz", "-labels-idx1-ubyte.gz"}) {
      if (!fs::exists(path + suffix)) config.fail_at(key, "names " + path + suffix + ", which does not exist");
    }
    io::IdxArray images = io::read_idx(path + "-images-idx3-ubyte.gz");
    io::IdxArray idx_labels = io::read_idx(path + "-labels-idx1-ubyte.gz");
    if (images.shape.size() != 3 || idx_labels.shape.size() != 1 || idx_labels.shape[0] != images.shape[0]) {
      config.fail_at(key, "files do not hold images [N, H, W] and labels [N] of the same N");
    }
    shape = images.shape;
    pixels = std::move(images.data);
    labels.assign(idx_labels.data.begin(), idx_labels.data.end());
  } else {
    if (!fs::exists(path)) config.fail_at(key, "= " + path + " does not exist");
    io::ImageArray array =
        io::read_hdf5_images(path, config.get_string("data.hdf5_images"), config.get_string("data.hdf5_labels"));
    shape = array.shape;
    pixels = std::move(array.pixels);
    labels = std::move(array.labels);
  }
  const int64_t channels = shape.size() == 4 ? shape[3] : 1;
  if (channels != model.num_channels && !(channels == 3 && model.num_channels == 1)) {
    config.fail_at("model.num_channels", "is " + std::to_string(model.num_channels) + " but the images of " + key +
                                             " have " + std::to_string(channels) + " channel(s)");
  }
  check_labels(config, key, labels, model.num_labels);
  return std::make_unique<ArrayDataset>(std::move(shape), std::move(pixels), std::move(labels), transform,
                                        model.num_labels, host_staging_options(device));
}

}  // namespace kuafu::vit
