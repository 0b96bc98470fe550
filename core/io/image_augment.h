// Image transforms for classification: torchvision-style random-resized crop + flip for training,
// resize + centre crop for evaluation; both normalise and write CHW floats.
#pragma once

#include <opencv2/core.hpp>
#include <random>
#include <vector>

#include "core/io/aspect_buckets.h"

namespace kuafu::io {

struct ImageTransform {
  int size = 224;                                   // output side in pixels
  int channels = 3;                                 // 3: RGB output; 1: gray output (mean/std then have one value each)
  double scale_min = 0.08, scale_max = 1.0;         // crop area as a fraction of the image
  double ratio_min = 3.0 / 4, ratio_max = 4.0 / 3;  // crop aspect ratio (width / height)
  bool flip = true;                                 // random horizontal flip in training
  double resize_ratio = 0.875;                      // eval: crop side / resized shorter side
  std::vector<float> mean{0.485f, 0.456f, 0.406f}, std{0.229f, 0.224f, 0.225f};  // per output channel
  // diffusers' training scripts' preparation instead of the random-resized crop and resize_ratio: the shorter
  // side resized to `size` (the longer keeping the aspect ratio, truncated as torchvision's Resize), flipped
  // (training, `flip`), then a size × size square cut out at the centre (rounded as torchvision's CenterCrop),
  // or in training anywhere when random_square_crop (RandomCrop).
  bool square_crop = false;
  bool random_square_crop = false;
  // Aspect-ratio buckets (with square_crop): each image is resized to cover the bucket nearest its aspect ratio
  // (nearest_bucket) instead of the size × size square, then cut to it the same way; nothing is cut when the
  // ratios agree.
  std::vector<ImageSize> buckets;
};

// The output's height and width for a source image of `source` pixels: its bucket, else size × size.
ImageSize output_size(const ImageTransform& t, ImageSize source);

// Where a transformed image came from: the source image's size, and the top-left corner of the square cut
// from it as resized (0, 0 for a random-resized crop): SDXL's original_size and crops_coords_top_left.
struct ImagePlacement {
  int64_t original_height = 0, original_width = 0, top = 0, left = 0;
  bool operator==(const ImagePlacement& o) const {
    return original_height == o.original_height && original_width == o.original_width && top == o.top && left == o.left;
  }
};

// Throws kuafu::Error naming the bad field (sizes, ranges, mean/std length vs channels).
void check_transform(const ImageTransform& t);

// `image`: 8-bit gray, BGR or BGRA (cv::imread's order). Writes t.channels * height * width floats (the
// output_size; channel-major, channels in RGB order) to `out`: ((pixel / 255) - mean[c]) / std[c]. Returns where the
// output came from.
ImagePlacement train_transform(const cv::Mat& image, const ImageTransform& t, std::mt19937_64& rng, float* out);
ImagePlacement eval_transform(const cv::Mat& image, const ImageTransform& t, float* out);

}  // namespace kuafu::io
