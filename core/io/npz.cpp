#include "core/io/npz.h"

#include <unistd.h>
#include <zip.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "core/util/atomic_file.h"
#include "core/util/error.h"

namespace kuafu::io {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

struct NumpyType {
  const char* descr;  // NumPy's dtype string, byte order included
  torch::ScalarType dtype;
};
constexpr NumpyType kTypes[] = {{"<f4", torch::kFloat32}, {"<f8", torch::kFloat64}, {"<f2", torch::kFloat16},
                                {"<i4", torch::kInt32},   {"<i8", torch::kInt64},   {"<i2", torch::kInt16},
                                {"|i1", torch::kInt8},    {"|u1", torch::kUInt8},   {"|b1", torch::kBool}};

// The value of 'key' in the header's Python dict literal ({'descr': '<f4', 'fortran_order': False,
// 'shape': (3, 4), }), as written: up to the next ", '" or the closing brace.
std::string header_value(const std::string& header, const std::string& key, const std::string& where) {
  const size_t at = header.find("'" + key + "':");
  KUAFU_CHECK(at != std::string::npos, where, ": the .npy header has no '", key, "': ", header);
  size_t begin = at + key.size() + 3;
  while (begin < header.size() && header[begin] == ' ') ++begin;
  size_t end = header[begin] == '(' ? header.find(')', begin) + 1 : header.find_first_of(",}", begin);
  KUAFU_CHECK(end != std::string::npos && end > begin, where, ": cannot read '", key, "' in the .npy header: ", header);
  return header.substr(begin, end - begin);
}

std::vector<int64_t> shape_of(const std::string& tuple, const std::string& where) {
  std::vector<int64_t> shape;
  const std::string inside = tuple.substr(1, tuple.size() - 2);  // without the parentheses
  size_t at = 0;
  while (at < inside.size()) {
    const size_t comma = inside.find(',', at);
    const std::string item = inside.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item.find_first_not_of(' ') != std::string::npos) {
      size_t used = 0;
      int64_t n = -1;
      try {
        n = std::stoll(item, &used);
      } catch (const std::exception&) {
      }
      KUAFU_CHECK(n >= 0, where, ": shape ", tuple, " is not a tuple of sizes");
      shape.push_back(n);
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return shape;
}

// libzip's archive, closed (and for a writer, discarded unless committed) when it goes.
struct ZipArchive {
  zip_t* zip = nullptr;
  ~ZipArchive() {
    if (zip) zip_discard(zip);
  }
};

}  // namespace

torch::Tensor parse_npy(const std::string& bytes, const std::string& where) {
  KUAFU_CHECK(bytes.size() >= 10 && bytes.compare(0, kMagicSize, kMagic, kMagicSize) == 0, where,
              ": not a .npy array (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  KUAFU_CHECK(major >= 1 && major <= 3, where, ": .npy format version ", major, " is not 1, 2 or 3");
  const size_t length_bytes = major == 1 ? 2 : 4;
  KUAFU_CHECK(bytes.size() >= 8 + length_bytes, where, ": the .npy header is cut short");
  size_t header_length = 0;
  for (size_t i = 0; i < length_bytes; ++i) header_length |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  const size_t data_at = 8 + length_bytes + header_length;
  KUAFU_CHECK(bytes.size() >= data_at, where, ": the .npy header (", header_length, " bytes) is cut short");
  const std::string header = bytes.substr(8 + length_bytes, header_length);
  std::string descr = header_value(header, "descr", where);
  descr = descr.substr(1, descr.size() - 2);  // its quotes
  const NumpyType* type = nullptr;
  for (const NumpyType& t : kTypes) {
    if (descr == t.descr) type = &t;
  }
  KUAFU_CHECK(type, where, ": dtype '", descr, "' is not one Kuafu reads (little-endian float16/32/64, int8-64, uint8, bool)");
  const bool fortran = header_value(header, "fortran_order", where) == "True";
  std::vector<int64_t> shape = shape_of(header_value(header, "shape", where), where);
  int64_t count = 1;
  for (const int64_t n : shape) count *= n;
  const size_t expected = static_cast<size_t>(count) * torch::elementSize(type->dtype);
  KUAFU_CHECK(bytes.size() - data_at == expected, where, ": ", bytes.size() - data_at, " bytes of data where shape ",
              header_value(header, "shape", where), " of ", descr, " needs ", expected);
  if (fortran) std::reverse(shape.begin(), shape.end());
  torch::Tensor array = torch::empty(shape, torch::TensorOptions().dtype(type->dtype));
  if (expected > 0) std::memcpy(array.data_ptr(), bytes.data() + data_at, expected);
  if (fortran) {
    std::vector<int64_t> reversed(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) reversed[i] = static_cast<int64_t>(shape.size() - 1 - i);
    array = array.permute(reversed).contiguous();
  }
  return array;
}

std::string format_npy(const torch::Tensor& array) {
  const NumpyType* type = nullptr;
  for (const NumpyType& t : kTypes) {
    if (t.dtype == array.scalar_type()) type = &t;
  }
  KUAFU_CHECK(type, "dtype ", array.scalar_type(), " has no NumPy dtype that .npy files hold");
  std::string shape = "(";
  for (int64_t i = 0; i < array.dim(); ++i) shape += std::to_string(array.size(i)) + (array.dim() == 1 ? "," : i + 1 < array.dim() ? ", " : "");
  shape += ")";
  std::string header = std::string("{'descr': '") + type->descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Format 1.0: magic, version, a 2-byte length, then the header padded with spaces and ended by a
  // newline so that the data starts at a multiple of 64 bytes, as NumPy writes it.
  const size_t unpadded = kMagicSize + 4 + header.size() + 1;
  header += std::string((64 - unpadded % 64) % 64, ' ') + "\n";
  const torch::Tensor data = array.cpu().contiguous();
  std::string bytes(kMagic, kMagicSize);
  bytes += '\x01';
  bytes += '\x00';
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header;
  bytes.append(static_cast<const char*>(data.data_ptr()), data.numel() * data.element_size());
  return bytes;
}

NpzArrays read_npz(const std::string& path) {
  int error = 0;
  ZipArchive archive{zip_open(path.c_str(), ZIP_RDONLY, &error)};
  if (!archive.zip) {
    zip_error_t reason;
    zip_error_init_with_code(&reason, error);
    const std::string text = zip_error_strerror(&reason);
    zip_error_fini(&reason);
    fail(path + ": cannot open as an .npz (zip) archive: " + text);
  }
  NpzArrays arrays;
  const zip_int64_t entries = zip_get_num_entries(archive.zip, 0);
  for (zip_int64_t i = 0; i < entries; ++i) {
    zip_stat_t stat;
    KUAFU_CHECK(zip_stat_index(archive.zip, i, 0, &stat) == 0, path, ": cannot read entry ", i, " of the archive");
    std::string name = stat.name;
    const std::string where = path + " entry " + name;
    std::string bytes(stat.size, '\0');
    zip_file_t* file = zip_fopen_index(archive.zip, i, 0);
    KUAFU_CHECK(file, where, ": cannot open: ", zip_strerror(archive.zip));
    const zip_int64_t read = zip_fread(file, bytes.data(), stat.size);
    zip_fclose(file);
    KUAFU_CHECK(read == static_cast<zip_int64_t>(stat.size), where, ": read ", read, " of its ", stat.size, " bytes");
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0) name.resize(name.size() - 4);
    arrays[name] = parse_npy(bytes, where);
  }
  return arrays;
}

void write_npz(const std::string& path, const NpzArrays& arrays) {
  // libzip writes the archive at close; it is built beside `path` and renamed over it only when whole.
  const std::string partial = path + ".partial-" + std::to_string(::getpid());
  std::vector<std::string> entries;  // libzip reads the buffers at close
  entries.reserve(arrays.size());
  {
    int error = 0;
    ZipArchive archive{zip_open(partial.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error)};
    KUAFU_CHECK(archive.zip, partial, ": cannot create the archive (libzip error ", error, ")");
    for (const auto& [name, array] : arrays) {
      entries.push_back(format_npy(array));
      zip_source_t* source = zip_source_buffer(archive.zip, entries.back().data(), entries.back().size(), 0);
      const zip_int64_t index = source ? zip_file_add(archive.zip, (name + ".npy").c_str(), source, ZIP_FL_ENC_UTF_8) : -1;
      if (index < 0) {
        if (source) zip_source_free(source);
        fail(partial + ": cannot add " + name + ": " + zip_strerror(archive.zip));
      }
      zip_set_file_compression(archive.zip, static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0);
    }
    const int closed = zip_close(archive.zip);
    if (closed != 0) {
      const std::string reason = zip_strerror(archive.zip);
      std::filesystem::remove(partial);
      fail(path + ": cannot write the archive: " + reason);
    }
    archive.zip = nullptr;
  }
  fsync_path(partial);
  rename_durable(partial, path);
}

}  // namespace kuafu::io
