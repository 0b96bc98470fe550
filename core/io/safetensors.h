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

// Validates the header (length, JSON, unique non-empty names, dtypes, integer shapes and offsets, sizes
// that fit in 64 bits, data inside the file, no overlaps) and throws kuafu::Error naming the file and
// the offending entry.
SafetensorsFile load_safetensors(const std::string& path);

// Whether tensor `name` of `file`, as `stored`, may be copied into a tensor of dtype `target`; throws
// kuafu::Error naming both when not. Loaders of weights and optimizer state call it before copying.
// Refused: a dtype change other than among the floating widths F16, BF16, F32 and F64 (a checkpoint
// written in one precision loads into a model in another; integer or boolean bits never become floats,
// nor other integers); any NaN or infinity stored in a floating tensor; values that the narrowing to
// `target` would make infinite (1e5 into F16). Shapes are the caller's to compare (shards differ).
void check_loadable(const std::string& file, const std::string& name, const torch::Tensor& stored,
                    torch::ScalarType target);
inline void check_loadable(const std::string& file, const std::string& name, const torch::Tensor& stored,
                           const torch::Tensor& target) {
  check_loadable(file, name, stored, target.scalar_type());
}

}  // namespace kuafu::io
