#include "core/io/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string_view>

#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::io {
namespace {

struct DtypeName {
  torch::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {torch::kFloat32, "F32"}, {torch::kFloat64, "F64"}, {torch::kFloat16, "F16"}, {torch::kBFloat16, "BF16"},
    {torch::kInt64, "I64"},   {torch::kInt32, "I32"},   {torch::kInt16, "I16"},   {torch::kInt8, "I8"},
    {torch::kUInt8, "U8"},    {torch::kBool, "BOOL"},
};

const char* dtype_name(torch::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  fail(std::string("safetensors cannot store dtype ") + c10::toString(type));
}

torch::ScalarType dtype_from(const std::string& name, const std::string& where) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  fail(where + ": unsupported dtype \"" + text::abbreviate(name) + "\"");
}

// The dtype as messages name it: the safetensors name where there is one.
std::string dtype_label(torch::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  return c10::toString(type);
}

bool is_float_width(torch::ScalarType type) {
  return type == torch::kFloat16 || type == torch::kBFloat16 || type == torch::kFloat32 || type == torch::kFloat64;
}

int64_t count_non_finite(const torch::Tensor& t) {
  return torch::isfinite(t).logical_not().sum().item<int64_t>();
}

// How messages name a tensor of a file; a huge name is shortened.
std::string tensor_where(const std::string& path, const std::string& name) {
  return path + ": tensor '" + text::abbreviate(name) + "'";
}

// A JSON value as written, shortened for messages.
std::string shown(const nlohmann::json& value) {
  return text::abbreviate(value.dump());
}

// Parses the header JSON, refusing a key given twice in one object: nlohmann::json would silently
// keep one of two tensors of the same name.
nlohmann::json parse_header(const std::string& path, std::string_view text) {
  std::vector<std::set<std::string>> keys;  // of each object being read, innermost last
  std::string tensor;                       // the top-level key being read
  const auto check_keys = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) keys.emplace_back();
    if (event == Event::object_end) keys.pop_back();
    if (event != Event::key) return true;
    const std::string& key = parsed.get_ref<const std::string&>();
    if (keys.size() == 1) tensor = key;
    KUAFU_CHECK(keys.back().insert(key).second, tensor_where(path, tensor),
                keys.size() == 1 ? ": named twice in the header" : ": key '" + text::abbreviate(key) + "' given twice");
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), check_keys);
  } catch (const nlohmann::json::exception& e) {
    fail(path + ": header is not valid JSON: " + text::abbreviate(e.what(), 300));
  }
}

// The non-negative integer that `value` must be; false when it is anything else (2.0, -1, "2").
bool as_count(const nlohmann::json& value, uint64_t* out) {
  if (!value.is_number_unsigned()) return false;
  *out = value.get<uint64_t>();
  return true;
}

// Where a tensor's data lies, checked against its dtype, shape and the data section.
struct Entry {
  torch::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

std::vector<int64_t> read_shape(const std::string& where, const nlohmann::json& shape) {
  std::vector<int64_t> out;
  bool valid = shape.is_array();
  for (size_t i = 0; valid && i < shape.size(); ++i) {
    uint64_t d = 0;
    valid = as_count(shape[i], &d) && d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    out.push_back(static_cast<int64_t>(d));
  }
  KUAFU_CHECK(valid, where, ": shape: expected a list of non-negative integers, found ", shown(shape));
  return out;
}

// Bytes the shape needs, refusing a product that does not fit in 64 bits.
uint64_t shape_bytes(const std::string& where, const nlohmann::json& shape, const std::vector<int64_t>& dims,
                     torch::ScalarType type) {
  uint64_t numel = 1;
  for (int64_t d : dims) {
    KUAFU_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel), where, ": shape ", shown(shape),
                " has more elements than fit in 64 bits");
  }
  uint64_t bytes = 0;
  KUAFU_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(c10::elementSize(type)), &bytes), where,
              ": shape ", shown(shape), " of ", dtype_label(type), " needs more bytes than fit in 64 bits");
  return bytes;
}

Entry read_entry(const std::string& where, const nlohmann::json& entry, uint64_t data_size) {
  KUAFU_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                  entry.contains("data_offsets"),
              where, " needs dtype, shape and data_offsets");
  const nlohmann::json& dtype = entry["dtype"];
  KUAFU_CHECK(dtype.is_string(), where, ": dtype: expected a string such as \"F32\", found ", shown(dtype));
  Entry out;
  out.type = dtype_from(dtype.get<std::string>(), where);
  out.shape = read_shape(where, entry["shape"]);
  const uint64_t bytes = shape_bytes(where, entry["shape"], out.shape, out.type);
  const nlohmann::json& offsets = entry["data_offsets"];
  KUAFU_CHECK(offsets.is_array() && offsets.size() == 2 && as_count(offsets[0], &out.begin) &&
                  as_count(offsets[1], &out.end),
              where, ": data_offsets: expected two non-negative integers [begin, end], found ", shown(offsets));
  KUAFU_CHECK(out.begin <= out.end, where, ": data_offsets: expected begin <= end, found ", shown(offsets));
  KUAFU_CHECK(out.end <= data_size, where, ": data ends at byte ", out.end, " but the file holds only ", data_size,
              " data bytes (truncated?)");
  KUAFU_CHECK(out.end - out.begin == bytes, where, ": shape ", shown(entry["shape"]), " of ", dtype_label(out.type),
              " needs ", bytes, " bytes, data_offsets give ", out.end - out.begin);
  return out;
}

void append_u64_le(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

const torch::Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

FileSum save_safetensors(const std::string& path, const NamedTensors& tensors,
                         const std::map<std::string, std::string>& metadata,
                         const std::function<void(const torch::Tensor&)>& before_write) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
    header[name] = {{"dtype", dtype_name(tensor.scalar_type())}, {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as the format advises
  return write_file_atomic_streamed(path, [&](const ByteSink& write) {
    std::string length;
    append_u64_le(length, json.size());
    write(length.data(), length.size());
    write(json.data(), json.size());
    for (const auto& item : tensors) {
      if (before_write) before_write(item.second);
      // One tensor at a time on the host: a sharded master or a GPU weight is never copied whole with the rest.
      const torch::Tensor t = item.second.detach().to(torch::kCPU).contiguous();
      write(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
    }
  });
}

const SafetensorsEntry* SafetensorsIndex::find(const std::string& name) const {
  for (const auto& entry : entries) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

namespace {

// Reads `bytes` bytes at `offset` of the open file into `out`.
void read_at(std::ifstream& in, const std::string& path, uint64_t offset, char* out, uint64_t bytes) {
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(out, static_cast<std::streamsize>(bytes));
  KUAFU_CHECK(in.good() || (bytes == 0), path, ": cannot read ", bytes, " bytes at byte ", offset, " (file changed?)");
}

}  // namespace

SafetensorsIndex read_safetensors_index(const std::string& path) {
  std::error_code error;
  const uint64_t file_size = std::filesystem::file_size(path, error);
  KUAFU_CHECK(!error, "cannot open ", path, ": ", error.message());
  KUAFU_CHECK(file_size >= 8, path, ": too short for a safetensors file (", file_size, " bytes)");
  std::ifstream in(path, std::ios::binary);
  KUAFU_CHECK(in.good(), "cannot open ", path);
  unsigned char length[8];
  read_at(in, path, 0, reinterpret_cast<char*>(length), 8);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(length[i]) << (8 * i);
  KUAFU_CHECK(header_len <= file_size - 8, path, ": header length ", header_len, " exceeds the file size ", file_size,
              " (truncated or not a safetensors file)");
  std::string text(header_len, '\0');
  read_at(in, path, 8, text.data(), header_len);
  const nlohmann::json header = parse_header(path, text);
  KUAFU_CHECK(header.is_object(), path, ": header must be a JSON object");
  SafetensorsIndex index;
  index.path = path;
  index.data_start = 8 + header_len;
  const uint64_t data_size = file_size - index.data_start;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      KUAFU_CHECK(entry.is_object(), path, ": __metadata__: expected an object of strings, found ", shown(entry));
      for (const auto& [k, v] : entry.items()) {
        KUAFU_CHECK(v.is_string(), path, ": metadata value for '", text::abbreviate(k), "' must be a string");
        index.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = tensor_where(path, name);
    KUAFU_CHECK(!name.empty(), where, ": expected a non-empty name");
    const Entry e = read_entry(where, entry, data_size);
    index.entries.push_back({name, e.type, e.shape, e.begin, e.end});
  }
  // nlohmann::json hands entries back sorted by name: file (offset) order instead.
  std::sort(index.entries.begin(), index.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::make_pair(a.begin, a.end) < std::make_pair(b.begin, b.end);
  });
  // No byte of the data is left unindexed (the official reader refuses holes and trailing bytes too): in
  // offset order the ranges tile the data section from its first byte to its last, neither overlapping
  // nor apart.
  uint64_t covered = 0;
  for (size_t k = 0; k < index.entries.size(); ++k) {
    const SafetensorsEntry& e = index.entries[k];
    KUAFU_CHECK(e.begin >= covered, path, ": tensor data ranges of '", text::abbreviate(index.entries[k - 1].name),
                "' and '", text::abbreviate(e.name), "' overlap");
    KUAFU_CHECK(e.begin == covered, path, ": data bytes [", covered, ", ", e.begin, ") belong to no tensor (a gap before '",
                text::abbreviate(e.name), "')");
    covered = e.end;
  }
  KUAFU_CHECK(covered == data_size, path, ": the last ", data_size - covered, " data bytes belong to no tensor (",
              "trailing bytes after the data of ", index.entries.empty() ? std::string("no tensor") :
              "'" + text::abbreviate(index.entries.back().name) + "'", ")");
  return index;
}

namespace {
std::atomic<uint64_t> bytes_read{0};
}  // namespace

uint64_t tensor_bytes_read() { return bytes_read.load(); }

torch::Tensor read_elements(const SafetensorsIndex& index, const SafetensorsEntry& entry, int64_t first, int64_t count) {
  const auto element = static_cast<uint64_t>(c10::elementSize(entry.dtype));
  const uint64_t numel = (entry.end - entry.begin) / element;
  if (count < 0) count = static_cast<int64_t>(numel) - first;
  KUAFU_CHECK(first >= 0 && count >= 0 && static_cast<uint64_t>(first) + static_cast<uint64_t>(count) <= numel,
              tensor_where(index.path, entry.name), ": elements [", first, ", ", first + count, ") of ", numel, " asked for");
  torch::Tensor t = torch::empty({count}, torch::TensorOptions().dtype(entry.dtype));
  std::ifstream in(index.path, std::ios::binary);
  KUAFU_CHECK(in.good(), "cannot open ", index.path);
  read_at(in, index.path, index.data_start + entry.begin + static_cast<uint64_t>(first) * element,
          static_cast<char*>(t.data_ptr()), static_cast<uint64_t>(count) * element);
  bytes_read += static_cast<uint64_t>(count) * element;
  return t;
}

torch::Tensor read_box(const SafetensorsIndex& index, const SafetensorsEntry& entry, int64_t first,
                       const std::vector<int64_t>& shape, const std::vector<int64_t>& begin,
                       const std::vector<int64_t>& size) {
  const auto element = static_cast<uint64_t>(c10::elementSize(entry.dtype));
  const int64_t held = static_cast<int64_t>((entry.end - entry.begin) / element);
  const size_t dims = shape.size();
  int64_t extent = 1, box = 1;
  bool inside = dims > 0 && begin.size() == dims && size.size() == dims && first >= 0;
  for (size_t d = 0; inside && d < dims; ++d) {
    inside = shape[d] >= 0 && begin[d] >= 0 && size[d] >= 0 && begin[d] + size[d] <= shape[d];
    extent *= shape[d];
    box *= size[d];
  }
  KUAFU_CHECK(inside && extent <= held - first, tensor_where(index.path, entry.name), ": a box of ",
              torch::IntArrayRef(size), " at ", torch::IntArrayRef(begin), " of ", torch::IntArrayRef(shape), " from element ",
              first, " does not lie in its ", held, " elements");
  torch::Tensor out = torch::empty(size, torch::TensorOptions().dtype(entry.dtype));
  if (box == 0) return out;
  // Row-major strides of `shape`, and where the box's first element lies.
  std::vector<int64_t> stride(dims, 1);
  for (size_t d = dims - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  int64_t start = first;
  for (size_t d = 0; d < dims; ++d) start += begin[d] * stride[d];
  // A run: the last dimension's span, grown over every dimension the box holds whole (those after `inner`).
  size_t inner = dims - 1;
  int64_t run = size[inner];
  while (inner > 0 && size[inner] == shape[inner]) run *= size[--inner];
  std::ifstream in(index.path, std::ios::binary);
  KUAFU_CHECK(in.good(), "cannot open ", index.path);
  char* into = static_cast<char*>(out.data_ptr());
  const uint64_t run_bytes = static_cast<uint64_t>(run) * element;
  std::vector<int64_t> at(inner, 0);  // the run's index along each dimension before `inner`
  for (int64_t runs = box / run; runs > 0; --runs) {
    int64_t element_index = start;
    for (size_t d = 0; d < inner; ++d) element_index += at[d] * stride[d];
    read_at(in, index.path, index.data_start + entry.begin + static_cast<uint64_t>(element_index) * element, into, run_bytes);
    into += run_bytes;
    for (size_t d = inner; d-- > 0;) {  // the next run, last dimension fastest
      if (++at[d] < size[d]) break;
      at[d] = 0;
    }
  }
  bytes_read += static_cast<uint64_t>(box) * element;
  return out;
}

torch::Tensor read_tensor(const SafetensorsIndex& index, const SafetensorsEntry& entry) {
  return read_elements(index, entry, 0, -1).view(entry.shape);
}

SafetensorsFile load_safetensors(const std::string& path) {
  const SafetensorsIndex index = read_safetensors_index(path);
  SafetensorsFile file;
  file.metadata = index.metadata;
  for (const auto& entry : index.entries) file.tensors.emplace_back(entry.name, read_tensor(index, entry));
  return file;
}

void check_loadable(const std::string& file, const std::string& name, const torch::Tensor& stored,
                    torch::ScalarType target) {
  const torch::ScalarType type = stored.scalar_type();
  const std::string where = tensor_where(file, name);
  KUAFU_CHECK(type == target || (is_float_width(type) && is_float_width(target)), where, " is stored as ",
              dtype_label(type), " but expected ", dtype_label(target),
              " (only F16, BF16, F32 and F64 convert into each other)");
  if (!is_float_width(type)) return;
  // Counted a slice at a time: the masks and the converted copy of a whole large tensor would double
  // what loading it holds.
  constexpr int64_t kSlice = int64_t{1} << 20;
  const torch::Tensor flat = stored.reshape(-1);
  int64_t non_finite = 0, overflowing = 0;
  for (int64_t first = 0; first < flat.numel(); first += kSlice) {
    const torch::Tensor slice = flat.slice(0, first, std::min(first + kSlice, flat.numel()));
    const int64_t bad = count_non_finite(slice);
    non_finite += bad;
    if (bad == 0 && type != target) overflowing += count_non_finite(slice.to(target));
  }
  KUAFU_CHECK(non_finite == 0, where, " holds ", non_finite, " non-finite values (NaN or infinity) among ",
              stored.numel(), "; refusing to load it");
  KUAFU_CHECK(overflowing == 0, where, ": ", overflowing, " of its ", stored.numel(), " ", dtype_label(type),
              " values overflow ", dtype_label(target), " (they would become infinite)");
}

}  // namespace kuafu::io
