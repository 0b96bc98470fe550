// IDX files (the MNIST / Fashion-MNIST format): unsigned-byte arrays behind a big-endian header,
// read directly from .gz through zlib (uncompressed files work too).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kuafu::io {

// An n-dimensional uint8 array, row-major: data.size() is the product of shape.
struct IdxArray {
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// Layout: bytes 0x00 0x00 <type> <ndims>, then ndims big-endian int32 sizes, then the data.
// Only type 0x08 (unsigned byte) is supported. Throws kuafu::Error naming the path, and for format
// errors the (uncompressed) byte offset, what was expected and what was found.
IdxArray read_idx(const std::string& path);

}  // namespace kuafu::io
