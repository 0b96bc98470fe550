#include "core/io/idx_file.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/util/error.h"

namespace kuafu::io {
namespace {

constexpr uint8_t kUnsignedByte = 0x08;

struct GzClose {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzClose>;

std::string type_name(uint8_t type) {
  switch (type) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "short";
    case 0x0C: return "int";
    case 0x0D: return "float";
    case 0x0E: return "double";
    default: return "unknown";
  }
}

std::string hex(uint8_t b) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%02x", b);
  return text;
}

// Offsets count bytes of the decompressed stream; say so for gzipped files.
std::string at(gzFile file, uint64_t offset) {
  return detail::concat(gzdirect(file) ? "" : "uncompressed ", "byte offset ", offset);
}

// Reads up to n bytes (gzread takes an unsigned count, so large reads go in chunks); returns how
// many arrived. A zlib error (corrupt stream) throws.
uint64_t read_some(gzFile file, const std::string& path, uint64_t offset, uint8_t* out, uint64_t n) {
  constexpr uint64_t kChunk = uint64_t{1} << 30;
  uint64_t done = 0;
  while (done < n) {
    const unsigned want = static_cast<unsigned>(std::min(kChunk, n - done));
    const int got = gzread(file, out + done, want);
    if (got < 0) {
      // zlib inflates ahead of the caller, so the damage is somewhere at or after this offset.
      int code = 0;
      std::string message = gzerror(file, &code);
      if (message.rfind(path + ": ", 0) == 0) message.erase(0, path.size() + 2);
      fail(detail::concat("IDX file ", path, ": read error at or after ", at(file, offset + done), ": ", message,
                          code == Z_DATA_ERROR ? " (corrupt gzip data)" : ""));
    }
    done += static_cast<uint64_t>(got);
    if (static_cast<unsigned>(got) < want) break;
  }
  return done;
}

// "60000 x 28 x 28".
std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out;
  for (size_t d = 0; d < shape.size(); ++d) out += (d ? " x " : "") + std::to_string(shape[d]);
  return out;
}

// The data bytes the shape claims.
uint64_t data_bytes(const std::vector<int64_t>& shape, const std::string& path) {
  uint64_t count = 1;
  for (int64_t size : shape) {
    // A header claiming more than 2^40 bytes is corrupt, not a dataset; this also rules out overflow.
    KUAFU_CHECK(size == 0 || count <= (uint64_t{1} << 40) / static_cast<uint64_t>(size), "IDX file ", path,
                ": bad header: shape ", shape_text(shape), " implies more than 2^40 data bytes (corrupt header?)");
    count *= static_cast<uint64_t>(size);
  }
  return count;
}

// The `count` data bytes after the header. Memory follows the bytes that exist, never the header's
// claim alone: a plain file's size is known up front; gzipped data is read into a buffer that grows
// (doubling) as it arrives. So a small file with a lying header fails without a huge allocation.
std::vector<uint8_t> read_data(gzFile file, const std::string& path, uint64_t header, uint64_t count,
                               const std::string& shape) {
  const auto truncated = [&](uint64_t found) {
    fail(detail::concat("IDX file ", path, ": truncated data at ", at(file, header + found), ": expected ", count,
                        " data bytes (shape ", shape, ") after the ", header, "-byte header, found ", found));
  };
  uint64_t first_read = uint64_t{1} << 20;
  if (gzdirect(file)) {
    const uint64_t size = std::filesystem::file_size(path);
    const uint64_t available = size > header ? size - header : 0;
    if (available < count) truncated(available);
    first_read = count;
  }
  std::vector<uint8_t> data;
  while (data.size() < count) {
    const uint64_t before = data.size();
    const uint64_t want = std::min(count - before, std::max(first_read, before));
    data.resize(before + want);
    const uint64_t got = read_some(file, path, header + before, data.data() + before, want);
    data.resize(before + got);
    if (got < want) truncated(data.size());
  }
  return data;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  KUAFU_CHECK(std::filesystem::is_regular_file(path), "IDX file ", path, " does not exist or is not a file");
  GzFile file(gzopen(path.c_str(), "rb"));
  KUAFU_CHECK(file != nullptr, "cannot open IDX file ", path, ": ", std::strerror(errno));

  uint8_t magic[4];
  const uint64_t got_magic = read_some(file.get(), path, 0, magic, 4);
  KUAFU_CHECK(got_magic == 4, "IDX file ", path, ": truncated header at ", at(file.get(), 0),
              ": expected 4 bytes, found ", got_magic);
  KUAFU_CHECK(magic[0] == 0 && magic[1] == 0, "IDX file ", path, ": bad magic at ", at(file.get(), 0),
              ": expected 0x00 0x00, found ", hex(magic[0]), " ", hex(magic[1]), " (not an IDX file?)");
  KUAFU_CHECK(magic[2] == kUnsignedByte, "IDX file ", path, ": unsupported data type at ", at(file.get(), 2),
              ": expected 0x08 ", "(unsigned byte), found ", hex(magic[2]), " (", type_name(magic[2]), ")");
  const int ndims = magic[3];
  KUAFU_CHECK(ndims >= 1, "IDX file ", path, ": bad header at ", at(file.get(), 3),
              ": expected at least 1 dimension, found 0");

  std::vector<uint8_t> dims_bytes(4 * static_cast<size_t>(ndims));
  const uint64_t got_dims = read_some(file.get(), path, 4, dims_bytes.data(), dims_bytes.size());
  KUAFU_CHECK(got_dims == dims_bytes.size(), "IDX file ", path, ": truncated header at ", at(file.get(), 4 + got_dims),
              ": expected ", ndims, " dimension sizes (", dims_bytes.size(), " bytes), found ", got_dims, " bytes");

  IdxArray array;
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* p = &dims_bytes[4 * d];
    const uint32_t size = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
    KUAFU_CHECK(size <= 0x7fffffffu, "IDX file ", path, ": bad dimension ", d, " at ", at(file.get(), 4 + 4 * d),
                ": expected a non-negative int32, found ", size);
    array.shape.push_back(size);
  }
  const uint64_t count = data_bytes(array.shape, path);
  const uint64_t header = 4 + dims_bytes.size();
  array.data = read_data(file.get(), path, header, count, shape_text(array.shape));

  // Anything after the data means the header's dimensions do not describe the file.
  uint8_t extra[4096];
  uint64_t trailing = 0;
  while (const uint64_t n = read_some(file.get(), path, header + count + trailing, extra, sizeof extra)) {
    trailing += n;
  }
  KUAFU_CHECK(trailing == 0, "IDX file ", path, ": trailing data at ", at(file.get(), header + count),
              ": expected end of file, found ", trailing, " more bytes");
  return array;
}

}  // namespace kuafu::io
