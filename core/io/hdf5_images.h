// Image classification data stored in HDF5: a uint8 image dataset [N, H, W] or [N, H, W, C], an
// integer label dataset [N] and, when the file has one, a caption dataset of strings [N], read whole
// with the HDF5 C++ API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kuafu::io {

struct ImageArray {
  std::vector<int64_t> shape;   // [N, H, W] or [N, H, W, C]
  std::vector<uint8_t> pixels;  // row-major, product of shape
  std::vector<int64_t> labels;  // [N]
  std::vector<std::string> captions;  // [N] (trimmed) when the file has the caption dataset, else empty
};

// `images`, `labels` and `captions` are dataset names (paths inside the file); `captions` (fixed- or
// variable-length strings) is read when the file has it. Throws kuafu::Error naming the file and,
// where it applies, the dataset: missing or non-HDF5 file, missing dataset, wrong rank or element
// type, or a label or caption count that differs from N. HDF5's own error printing is turned off.
ImageArray read_hdf5_images(const std::string& path, const std::string& images = "images",
                            const std::string& labels = "labels", const std::string& captions = "captions");

}  // namespace kuafu::io
