#include "core/io/png_file.h"

#include <zlib.h>

#include "core/util/atomic_file.h"
#include "core/util/error.h"

namespace kuafu::io {

namespace {

constexpr char kSignature[] = "\x89PNG\r\n\x1a\n";

void put_u32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xFF));
}

uint32_t get_u32(const std::string& in, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(in[at + i]);
  return v;
}

// length, type, data, CRC-32 of type and data.
void put_chunk(std::string& out, const std::string& type, const std::string& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const std::string body = type + data;
  out += body;
  put_u32(out, static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
}

}  // namespace

void write_png(const std::string& path, const RgbImage& image, const std::vector<std::pair<std::string, std::string>>& text) {
  KUAFU_CHECK(image.width > 0 && image.height > 0 && image.pixels.size() == static_cast<size_t>(image.width * image.height * 3), path,
              ": an RGB image of ", image.width, "x", image.height, " needs ", image.width * image.height * 3, " bytes, got ",
              image.pixels.size());
  std::string png(kSignature, 8);
  std::string header;
  put_u32(header, static_cast<uint32_t>(image.width));
  put_u32(header, static_cast<uint32_t>(image.height));
  header += std::string{8, 2, 0, 0, 0};  // 8 bits, truecolour, deflate, adaptive filtering, no interlace
  put_chunk(png, "IHDR", header);
  for (const auto& [key, value] : text) {
    KUAFU_CHECK(!key.empty() && key.size() < 80 && key.find('\0') == std::string::npos, path, ": text key '", key,
                "' must be 1 to 79 characters");
    put_chunk(png, "tEXt", key + std::string(1, '\0') + value);
  }
  std::string rows;  // each scanline after its filter byte (0: none)
  rows.reserve(static_cast<size_t>(image.height * (1 + 3 * image.width)));
  for (int64_t y = 0; y < image.height; ++y) {
    rows.push_back('\0');
    rows.append(reinterpret_cast<const char*>(image.pixels.data() + y * image.width * 3), static_cast<size_t>(image.width * 3));
  }
  uLongf size = compressBound(static_cast<uLong>(rows.size()));
  std::string compressed(size, '\0');
  KUAFU_CHECK(compress2(reinterpret_cast<Bytef*>(compressed.data()), &size, reinterpret_cast<const Bytef*>(rows.data()),
                        static_cast<uLong>(rows.size()), Z_BEST_COMPRESSION) == Z_OK,
              path, ": zlib could not compress the image");
  compressed.resize(size);
  put_chunk(png, "IDAT", compressed);
  put_chunk(png, "IEND", "");
  write_file_atomic(path, png);
}

std::vector<std::pair<std::string, std::string>> read_png_text(const std::string& path) {
  const std::string png = read_file(path);
  KUAFU_CHECK(png.size() >= 8 && png.compare(0, 8, std::string(kSignature, 8)) == 0, path, " is not a PNG file");
  std::vector<std::pair<std::string, std::string>> text;
  for (size_t at = 8; at + 12 <= png.size();) {
    const uint32_t length = get_u32(png, at);
    KUAFU_CHECK(at + 12 + length <= png.size(), path, ": a chunk at byte ", at, " runs past the end");
    if (png.compare(at + 4, 4, "tEXt") == 0) {
      const std::string data = png.substr(at + 8, length);
      const size_t zero = data.find('\0');
      KUAFU_CHECK(zero != std::string::npos, path, ": a tEXt chunk without its key's terminator");
      text.emplace_back(data.substr(0, zero), data.substr(zero + 1));
    }
    at += 12 + length;
  }
  return text;
}

}  // namespace kuafu::io
