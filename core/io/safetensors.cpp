#include "core/io/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#include "core/util/atomic_file.h"
#include "core/util/error.h"

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
  fail(where + ": unsupported dtype \"" + name + "\"");
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

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", dtype_name(t.scalar_type())}, {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    contiguous.push_back(t);
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as the format advises
  std::string out;
  out.reserve(8 + json.size() + offset);
  append_u64_le(out, json.size());
  out += json;
  for (const auto& t : contiguous) {
    out.append(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * t.element_size());
  }
  write_file_atomic(path, out);
}

SafetensorsFile load_safetensors(const std::string& path) {
  const std::string bytes = read_file(path);
  KUAFU_CHECK(bytes.size() >= 8, path, ": too short for a safetensors file (", bytes.size(), " bytes)");
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  KUAFU_CHECK(header_len <= bytes.size() - 8, path, ": header length ", header_len,
              " exceeds the file size ", bytes.size(), " (truncated or not a safetensors file)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_len));
  } catch (const std::exception& e) {
    fail(path + ": header is not valid JSON: " + e.what());
  }
  KUAFU_CHECK(header.is_object(), path, ": header must be a JSON object");
  const uint64_t data_size = bytes.size() - 8 - header_len;
  const char* data = bytes.data() + 8 + header_len;

  SafetensorsFile file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : entry.items()) {
        KUAFU_CHECK(v.is_string(), path, ": metadata value for '", k, "' must be a string");
        file.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    KUAFU_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                    entry.contains("data_offsets"),
                where, " needs dtype, shape and data_offsets");
    const torch::ScalarType type = dtype_from(entry["dtype"].get<std::string>(), where);
    const auto shape = entry["shape"].get<std::vector<int64_t>>();
    const auto offsets = entry["data_offsets"].get<std::vector<uint64_t>>();
    KUAFU_CHECK(offsets.size() == 2 && offsets[0] <= offsets[1], where, ": bad data_offsets");
    KUAFU_CHECK(offsets[1] <= data_size, where, ": data ends at byte ", offsets[1], " but the file holds only ",
                data_size, " data bytes (truncated?)");
    int64_t numel = 1;
    for (int64_t d : shape) {
      KUAFU_CHECK(d >= 0, where, ": negative dimension");
      numel *= d;
    }
    const uint64_t expected = static_cast<uint64_t>(numel) * c10::elementSize(type);
    KUAFU_CHECK(offsets[1] - offsets[0] == expected, where, ": shape needs ", expected, " bytes, offsets give ",
                offsets[1] - offsets[0]);
    torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(type));
    if (expected > 0) std::memcpy(t.data_ptr(), data + offsets[0], expected);
    file.tensors.emplace_back(name, t);
    ranges.emplace_back(offsets[0], offsets[1]);
  }
  // nlohmann::json hands entries back sorted by name: restore file (offset) order.
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  NamedTensors in_file_order;
  for (size_t k = 0; k < order.size(); ++k) {
    if (k > 0) {
      KUAFU_CHECK(ranges[order[k]].first >= ranges[order[k - 1]].second, path, ": tensor data ranges of '",
                  file.tensors[order[k - 1]].first, "' and '", file.tensors[order[k]].first, "' overlap");
    }
    in_file_order.push_back(std::move(file.tensors[order[k]]));
  }
  file.tensors = std::move(in_file_order);
  return file;
}

}  // namespace kuafu::io
