// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header of
// {name: {dtype, shape, data_offsets}} plus optional "__metadata__", then the raw tensor bytes.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kuafu::io {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Writes atomically (temporary name, fsync, rename). Tensors are stored contiguous, on CPU.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  NamedTensors tensors;  // in file order
  std::map<std::string, std::string> metadata;
  const torch::Tensor* find(const std::string& name) const;
};

// Validates the header (length, JSON, dtypes, shapes, offsets inside the file, no overlaps) and
// throws kuafu::Error naming the file and the offending entry.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace kuafu::io
