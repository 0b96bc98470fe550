// Image classification data stored in HDF5: a uint8 image dataset [N, H, W] or [N, H, W, C] and an
// integer label dataset [N], read whole with the HDF5 C++ API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kuafu::io {

struct ImageArray {
  std::vector<int64_t> shape;   // [N, H, W] or [N, H, W, C]
  std::vector<uint8_t> pixels;  // row-major, product of shape
  std::vector<int64_t> labels;  // [N]
};

// `images` and `labels` are dataset names (paths inside the file). Throws kuafu::Error naming the
// file and, where it applies, the dataset: missing or non-HDF5 file, missing dataset, wrong rank or
// element type, or a label count that differs from N. HDF5's own error printing is turned off.
ImageArray read_hdf5_images(const std::string& path, const std::string& images = "images",
                            const std::string& labels = "labels");

}  // namespace kuafu::io
