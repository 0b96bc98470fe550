// Aspect-ratio buckets (kohya-ss sd-scripts' idea): training sizes of about one area in many shapes, so that an image
// trains whole, resized to the bucket nearest its aspect ratio, instead of cut to a square.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kuafu::io {

struct ImageSize {
  int64_t height = 0, width = 0;
  bool operator==(const ImageSize& o) const { return height == o.height && width == o.width; }
  bool operator!=(const ImageSize& o) const { return !(*this == o); }
};

struct BucketSpec {
  int64_t resolution = 512;  // a bucket's area is about resolution², and resolution × resolution (to a step) is one
  int64_t step = 64;         // every side is a multiple of it
  int64_t min_side = 256, max_side = 1024;  // every side lies within them
};

// Throws kuafu::Error naming the field that allows no bucket (sizes not positive, sides out of order or
// off the step).
void check_bucket_spec(const BucketSpec& spec);

// Every bucket of `spec`, tallest first (ascending width / height), as sd-scripts' make_bucket_resolutions makes
// them: for each width w from min_side to max_side in steps, the tallest height h of the step within max_side whose
// area in steps² is at most the resolution's (rounded down to a step), and the same turned on its side; and that
// square. Unlike sd-scripts, a height below min_side is left out.
std::vector<ImageSize> aspect_buckets(const BucketSpec& spec);

// The index of the bucket whose aspect ratio is nearest `image`'s, nearness measured as |log(ratio / ratio)| so
// that a 2:1 image and a 1:2 one are alike off square; the first of equals. `image` must have positive sides.
size_t nearest_bucket(const std::vector<ImageSize>& buckets, ImageSize image);

}  // namespace kuafu::io
