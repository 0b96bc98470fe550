// Image transforms for classification: torchvision-style random-resized crop + flip for training,
// resize + centre crop for evaluation; both normalise and write CHW floats.
#pragma once

#include <opencv2/core.hpp>
#include <random>
#include <vector>

namespace kuafu::io {

struct ImageTransform {
  int size = 224;                                   // output side in pixels
  int channels = 3;                                 // 3: RGB output; 1: gray output (mean/std then have one value each)
  double scale_min = 0.08, scale_max = 1.0;         // crop area as a fraction of the image
  double ratio_min = 3.0 / 4, ratio_max = 4.0 / 3;  // crop aspect ratio (width / height)
  bool flip = true;                                 // random horizontal flip in training
  double resize_ratio = 0.875;                      // eval: crop side / resized shorter side
  std::vector<float> mean{0.485f, 0.456f, 0.406f}, std{0.229f, 0.224f, 0.225f};  // per output channel
};

// Throws kuafu::Error naming the bad field (sizes, ranges, mean/std length vs channels).
void check_transform(const ImageTransform& t);

// `image`: 8-bit gray, BGR or BGRA (cv::imread's order). Writes t.channels * t.size * t.size floats
// (channel-major, channels in RGB order) to `out`: ((pixel / 255) - mean[c]) / std[c].
void train_transform(const cv::Mat& image, const ImageTransform& t, std::mt19937_64& rng, float* out);
void eval_transform(const cv::Mat& image, const ImageTransform& t, float* out);

}  // namespace kuafu::io
