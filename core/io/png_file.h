// PNG files with text: 8-bit RGB images written with zlib (no filtering), each text field a tEXt chunk
// ("prompt", "seed", "steps", ...), so a sample grid carries how it was made. OpenCV's imwrite writes no
// text chunks, and its codecs are optional in this build.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kuafu::io {

struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;  // row-major, 3 bytes a pixel
};

// Writes `image` to `path` (atomically: a failed write leaves no file); kuafu::Error naming the path,
// a field whose key is not 1-79 Latin-1 letters, or an image whose pixels do not match its size.
void write_png(const std::string& path, const RgbImage& image, const std::vector<std::pair<std::string, std::string>>& text = {});

// The text chunks of a PNG file, in order (kuafu::Error naming the file when it is not a PNG).
std::vector<std::pair<std::string, std::string>> read_png_text(const std::string& path);

}  // namespace kuafu::io
