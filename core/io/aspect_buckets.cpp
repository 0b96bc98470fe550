#include "core/io/aspect_buckets.h"

#include <algorithm>
#include <cmath>

#include "core/util/error.h"

namespace kuafu::io {

void check_bucket_spec(const BucketSpec& s) {
  KUAFU_CHECK(s.step > 0, "buckets.step must be positive, found ", s.step);
  KUAFU_CHECK(s.resolution >= s.step, "buckets: the resolution (", s.resolution, ") must be at least buckets.step (", s.step, ")");
  KUAFU_CHECK(s.min_side > 0 && s.min_side % s.step == 0 && s.max_side % s.step == 0, "buckets.min_side (", s.min_side,
              ") and buckets.max_side (", s.max_side, ") must be positive multiples of buckets.step (", s.step, ")");
  KUAFU_CHECK(s.min_side <= s.resolution && s.resolution <= s.max_side, "buckets: need buckets.min_side (", s.min_side,
              ") <= the resolution (", s.resolution, ") <= buckets.max_side (", s.max_side, ")");
}

std::vector<ImageSize> aspect_buckets(const BucketSpec& s) {
  check_bucket_spec(s);
  // Areas in steps², as sd-scripts counts them: the resolution rounded down to a step, squared.
  const int64_t side_steps = s.resolution / s.step, area_steps = side_steps * side_steps;
  std::vector<ImageSize> buckets = {{side_steps * s.step, side_steps * s.step}};
  for (int64_t width = s.min_side; width <= s.max_side; width += s.step) {
    const int64_t height = std::min(s.max_side, area_steps / (width / s.step) * s.step);
    if (height < s.min_side) continue;
    buckets.push_back({height, width});
    buckets.push_back({width, height});
  }
  // Tallest first; the comparison of w / h as w * h' < w' * h keeps it exact.
  std::sort(buckets.begin(), buckets.end(), [](const ImageSize& a, const ImageSize& b) {
    const int64_t left = a.width * b.height, right = b.width * a.height;
    return left != right ? left < right : a.width < b.width;
  });
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  return buckets;
}

size_t nearest_bucket(const std::vector<ImageSize>& buckets, ImageSize image) {
  KUAFU_CHECK(!buckets.empty(), "no aspect-ratio buckets to choose from");
  KUAFU_CHECK(image.height > 0 && image.width > 0, "an image of ", image.width, "x", image.height, " pixels has no aspect ratio");
  const double ratio = std::log(static_cast<double>(image.width) / static_cast<double>(image.height));
  size_t best = 0;
  double best_distance = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    const double distance =
        std::abs(std::log(static_cast<double>(buckets[i].width) / static_cast<double>(buckets[i].height)) - ratio);
    if (i == 0 || distance < best_distance) {
      best = i;
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace kuafu::io
