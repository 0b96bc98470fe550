#include "apps/stable_diffusion/class_images.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "apps/stable_diffusion/pipeline.h"
#include "core/io/png_file.h"


namespace kuafu::sd {

namespace fs = std::filesystem;

int64_t count_class_images(const DreamBoothSettings& settings) {
  if (!fs::is_directory(settings.class_data)) return 0;
  int64_t images = 0;
  for (const auto& entry : fs::recursive_directory_iterator(settings.class_data)) {
    std::string extension = entry.path().extension().string();
    for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    images += entry.is_regular_file() && (extension == ".png" || extension == ".jpg" || extension == ".jpeg");
  }
  return images;
}

int64_t make_class_images(const SdSettings& settings, const torch::Device& device) {
  const DreamBoothSettings& d = settings.dreambooth;
  const int64_t have = count_class_images(d);
  if (have >= d.class_images) return 0;
  torch::NoGradGuard no_grad;
  Pipeline pipeline = load_pipeline(settings.pipeline, device);
  const fs::path folder = fs::path(d.class_data) / "class";
  fs::create_directories(folder);
  SampleOptions options;
  options.steps = d.class_sample_steps;
  options.guidance = d.class_guidance;
  for (int64_t n = have; n < d.class_images; ++n) {
    options.seed = settings.train.seed + static_cast<uint64_t>(n);
    const Samples samples = sample(pipeline, {d.class_prompt}, options);
    const std::string stem = (folder / std::to_string(n)).string();
    std::ofstream(stem + ".txt") << d.class_prompt;  // before the image, which makes it count
    io::write_png(stem + ".png", sample_grid(samples.images), {{"prompt", d.class_prompt}, {"seed", std::to_string(options.seed)}});
  }
  std::cout << "made " << d.class_images - have << " class images of \"" << d.class_prompt << "\" in " << folder.string() << std::endl;
  return d.class_images - have;
}

}  // namespace kuafu::sd
