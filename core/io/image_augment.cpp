#include "core/io/image_augment.h"

#include <algorithm>
#include <cmath>
#include <opencv2/imgproc.hpp>

#include "core/util/error.h"

namespace kuafu::io {
namespace {

// The image as t.channels channels (RGB or gray), 8-bit.
cv::Mat to_output_channels(const cv::Mat& image, int channels) {
  KUAFU_CHECK(!image.empty(), "image transform: empty image");
  KUAFU_CHECK(image.depth() == CV_8U, "image transform: expected an 8-bit image, found OpenCV depth ", image.depth());
  const int in = image.channels();
  KUAFU_CHECK(in == 1 || in == 3 || in == 4, "image transform: expected 1, 3 or 4 channels, found ", in);
  static const int kToRgb[] = {0, cv::COLOR_GRAY2RGB, 0, cv::COLOR_BGR2RGB, cv::COLOR_BGRA2RGB};
  static const int kToGray[] = {0, 0, 0, cv::COLOR_BGR2GRAY, cv::COLOR_BGRA2GRAY};
  if (channels == 1 && in == 1) return image;
  cv::Mat converted;
  cv::cvtColor(image, converted, channels == 1 ? kToGray[in] : kToRgb[in]);
  return converted;
}

// Writes an 8-bit image as normalised CHW floats, through a per-channel table of the 256
// possible values (exact at 0 and 255, so outputs stay within [(0 - mean) / std, (1 - mean) / std]).
void write_chw(const cv::Mat& image, const ImageTransform& t, float* out) {
  const int c_count = t.channels;
  std::vector<float> table(static_cast<size_t>(256) * c_count);
  for (int c = 0; c < c_count; ++c) {
    for (int v = 0; v < 256; ++v) table[c * 256 + v] = (static_cast<float>(v) / 255.0f - t.mean[c]) / t.std[c];
  }
  const size_t plane = static_cast<size_t>(image.rows) * image.cols;
  for (int y = 0; y < image.rows; ++y) {
    const uint8_t* row = image.ptr<uint8_t>(y);
    float* out_row = out + static_cast<size_t>(y) * image.cols;
    for (int x = 0; x < image.cols; ++x) {
      for (int c = 0; c < c_count; ++c) out_row[c * plane + x] = table[c * 256 + row[x * c_count + c]];
    }
  }
}

// torchvision's RandomResizedCrop.get_params: up to 10 tries at a random area fraction and
// log-uniform aspect ratio; otherwise the whole image cropped to the nearest allowed ratio.
cv::Rect random_resized_crop(int width, int height, const ImageTransform& t, std::mt19937_64& rng) {
  const double area = static_cast<double>(width) * height;
  std::uniform_real_distribution<double> scale(t.scale_min, t.scale_max);
  std::uniform_real_distribution<double> log_ratio(std::log(t.ratio_min), std::log(t.ratio_max));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * scale(rng);
    const double ratio = std::exp(log_ratio(rng));
    const int w = static_cast<int>(std::lround(std::sqrt(target_area * ratio)));
    const int h = static_cast<int>(std::lround(std::sqrt(target_area / ratio)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int top = std::uniform_int_distribution<int>(0, height - h)(rng);
      const int left = std::uniform_int_distribution<int>(0, width - w)(rng);
      return {left, top, w, h};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < t.ratio_min) {
    h = std::clamp(static_cast<int>(std::lround(w / t.ratio_min)), 1, height);
  } else if (in_ratio > t.ratio_max) {
    w = std::clamp(static_cast<int>(std::lround(h * t.ratio_max)), 1, width);
  }
  return {(width - w) / 2, (height - h) / 2, w, h};
}

}  // namespace

void check_transform(const ImageTransform& t) {
  KUAFU_CHECK(t.square_crop || !t.random_square_crop, "image transform: random_square_crop needs square_crop");
  KUAFU_CHECK(t.size > 0, "image transform: size must be positive, found ", t.size);
  KUAFU_CHECK(t.channels == 1 || t.channels == 3, "image transform: channels must be 1 or 3, found ", t.channels);
  KUAFU_CHECK(0 < t.scale_min && t.scale_min <= t.scale_max && t.scale_max <= 1, "image transform: need 0 < scale_min",
              " <= scale_max <= 1, found ", t.scale_min, " and ", t.scale_max);
  KUAFU_CHECK(0 < t.ratio_min && t.ratio_min <= t.ratio_max, "image transform: need 0 < ratio_min <= ratio_max, found ",
              t.ratio_min, " and ", t.ratio_max);
  KUAFU_CHECK(0 < t.resize_ratio && t.resize_ratio <= 1, "image transform: resize_ratio must be in (0, 1], found ",
              t.resize_ratio);
  KUAFU_CHECK(static_cast<int>(t.mean.size()) == t.channels && static_cast<int>(t.std.size()) == t.channels,
              "image transform: mean and std need ", t.channels, " values (one per channel), found ", t.mean.size(),
              " and ", t.std.size());
  for (float s : t.std) KUAFU_CHECK(s > 0, "image transform: std values must be positive, found ", s);
  KUAFU_CHECK(t.buckets.empty() || t.square_crop, "image transform: aspect-ratio buckets need square_crop's resize and cut");
  for (const ImageSize& b : t.buckets) {
    KUAFU_CHECK(b.height > 0 && b.width > 0, "image transform: a bucket of ", b.width, "x", b.height, " pixels");
  }
}

ImageSize output_size(const ImageTransform& t, ImageSize source) {
  if (t.buckets.empty()) return {t.size, t.size};
  return t.buckets[nearest_bucket(t.buckets, source)];
}

namespace {

// `source` resized, keeping its aspect ratio, to the smallest size that covers `target`: one side meets the
// target's, the other is truncated as torchvision's Resize does (never below the target's). For a square target,
// the shorter side resized to it.
cv::Mat resized_to_cover(const cv::Mat& source, ImageSize target) {
  const bool wider = static_cast<int64_t>(source.cols) * target.height >= static_cast<int64_t>(source.rows) * target.width;
  const cv::Size size = wider ? cv::Size(static_cast<int>(target.height * source.cols / source.rows), static_cast<int>(target.height))
                              : cv::Size(static_cast<int>(target.width), static_cast<int>(target.width * source.rows / source.cols));
  cv::Mat resized;
  cv::resize(source, resized, size, 0, 0, cv::INTER_LINEAR);
  return resized;
}

cv::Mat resized_shorter_side(const cv::Mat& source, int shorter) { return resized_to_cover(source, {shorter, shorter}); }

// torchvision's CenterCrop offset: round((length - size) / 2), halves to even as Python's round.
int centred(int length, int size) { return static_cast<int>(std::nearbyint((length - size) / 2.0)); }

// diffusers' preparation (ImageTransform::square_crop): resize, flip in training, cut the square (or the bucket).
ImagePlacement square_crop(const cv::Mat& source, const ImageTransform& t, std::mt19937_64* training_rng, float* out) {
  const ImageSize target = output_size(t, {source.rows, source.cols});
  const int height = static_cast<int>(target.height), width = static_cast<int>(target.width);
  cv::Mat resized = resized_to_cover(source, target);
  if (training_rng && t.flip && std::bernoulli_distribution(0.5)(*training_rng)) cv::flip(resized, resized, 1);
  int top = centred(resized.rows, height), left = centred(resized.cols, width);
  if (training_rng && t.random_square_crop) {
    top = std::uniform_int_distribution<int>(0, resized.rows - height)(*training_rng);
    left = std::uniform_int_distribution<int>(0, resized.cols - width)(*training_rng);
  }
  write_chw(resized(cv::Rect(left, top, width, height)), t, out);
  return {source.rows, source.cols, top, left};
}

}  // namespace

ImagePlacement train_transform(const cv::Mat& image, const ImageTransform& t, std::mt19937_64& rng, float* out) {
  check_transform(t);
  const cv::Mat source = to_output_channels(image, t.channels);
  if (t.square_crop) return square_crop(source, t, &rng, out);
  const cv::Rect crop = random_resized_crop(source.cols, source.rows, t, rng);
  cv::Mat resized;
  cv::resize(source(crop), resized, cv::Size(t.size, t.size), 0, 0, cv::INTER_LINEAR);
  if (t.flip && std::bernoulli_distribution(0.5)(rng)) cv::flip(resized, resized, 1);
  write_chw(resized, t, out);
  return {source.rows, source.cols, 0, 0};
}

ImagePlacement eval_transform(const cv::Mat& image, const ImageTransform& t, float* out) {
  check_transform(t);
  const cv::Mat source = to_output_channels(image, t.channels);
  if (t.square_crop) return square_crop(source, t, nullptr, out);
  const cv::Mat resized = resized_shorter_side(source, static_cast<int>(std::lround(t.size / t.resize_ratio)));
  const cv::Rect crop((resized.cols - t.size) / 2, (resized.rows - t.size) / 2, t.size, t.size);
  write_chw(resized(crop), t, out);
  return {source.rows, source.cols, crop.y, crop.x};
}

}  // namespace kuafu::io
