#include "apps/vit/dataset.h"

#include "core/io/image_folder.h"
#include "core/util/error.h"

namespace kuafu::vit {

namespace {

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

// `read()`, with a kuafu::Error it throws reported at the config key `key`.
template <typename Read>
auto at_key(const config::Config& config, const std::string& key, Read&& read) {
  try {
    return read();
  } catch (const Error& e) {
    config.fail_at(key, e.what());
  }
}

}  // namespace

std::unique_ptr<io::ImageDataset> open_dataset(const config::Config& config, const ViTConfig& model, bool train,
                                               const torch::Device& device) {
  const std::string key = train ? "data.train" : "data.val";
  io::ImageSetSpec spec;
  spec.format = config.get_string("data.format");
  spec.path = config.get_string(key);
  if (spec.format == "folder" && !train) {  // labelled as the training set is
    spec.classes = at_key(config, "data.train", [&] { return io::image_folder_classes(config.get_string("data.train")); });
  }
  spec.hdf5_images = config.get_string("data.hdf5_images");
  spec.hdf5_labels = config.get_string("data.hdf5_labels");
  spec.num_classes = model.num_labels;
  spec.threads = static_cast<int>(config.get_int("data.workers"));
  spec.max_corrupt_images = config.get_int("data.max_corrupt_images");
  spec.transform = transform_of(config, model);
  std::unique_ptr<io::ImageDataset> set = at_key(config, key, [&] { return io::open_image_dataset(spec, device); });

  const int64_t channels = set->stored_channels();
  if (channels != 0 && channels != model.num_channels && !(channels == 3 && model.num_channels == 1)) {
    config.fail_at("model.num_channels", "is " + std::to_string(model.num_channels) + " but the images of " + key +
                                             " have " + std::to_string(channels) + " channel(s)");
  }
  const int64_t classes = static_cast<int64_t>(set->class_names().size());
  if (spec.format == "folder" && classes != model.num_labels) {
    config.fail_at("model.num_labels", "is " + std::to_string(model.num_labels) + " but " + spec.path + " has " +
                                           std::to_string(classes) + " class folders");
  }
  return set;
}

}  // namespace kuafu::vit
