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
  uint64_t count = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* p = &dims_bytes[4 * d];
    const uint32_t size = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
    KUAFU_CHECK(size <= 0x7fffffffu, "IDX file ", path, ": bad dimension ", d, " at ", at(file.get(), 4 + 4 * d),
                ": expected a non-negative int32, found ", size);
    // A header claiming more than 2^40 bytes is corrupt, not a dataset; this also rules out overflow.
    KUAFU_CHECK(size == 0 || count <= (uint64_t{1} << 40) / size, "IDX file ", path,
                ": dimensions imply more than 2^40 bytes of data (corrupt header?)");
    count *= size;
    array.shape.push_back(size);
  }

  const uint64_t header = 4 + dims_bytes.size();
  array.data.resize(count);
  const uint64_t got_data = read_some(file.get(), path, header, array.data.data(), count);
  KUAFU_CHECK(got_data == count, "IDX file ", path, ": truncated data at ", at(file.get(), header + got_data),
              ": expected ", count, " data bytes after the ", header, "-byte header, found ", got_data);

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
