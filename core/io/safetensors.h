// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header of
// {name: {dtype, shape, data_offsets}} plus optional "__metadata__", then the raw tensor bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/util/atomic_file.h"

namespace kuafu::io {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Writes atomically (temporary name, fsync, rename), streamed: one tensor at a time is brought to the
// CPU (and made contiguous) and written, so no copy of the whole file is ever built. Returns the file's
// size and CRC-32.
// `before_write`, when given, is called with each tensor just before its bytes are read (tensors whose
// memory comes from elsewhere on demand: Gemini's disk tier).
FileSum save_safetensors(const std::string& path, const NamedTensors& tensors,
                         const std::map<std::string, std::string>& metadata = {},
                         const std::function<void(const torch::Tensor&)>& before_write = nullptr);

struct SafetensorsFile {
  NamedTensors tensors;  // in file order
  std::map<std::string, std::string> metadata;
  const torch::Tensor* find(const std::string& name) const;
};

// Where one tensor lies in a file.
struct SafetensorsEntry {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // bytes, counted from the start of the data section
};

// A file's header alone, validated as load_safetensors validates it: tensors are then read one at a
// time (read_tensor), so that a reader holds only what it needs.
struct SafetensorsIndex {
  std::string path;
  uint64_t data_start = 0;               // byte of the file where the data section begins
  std::vector<SafetensorsEntry> entries;  // in file (offset) order
  std::map<std::string, std::string> metadata;
  const SafetensorsEntry* find(const std::string& name) const;
};
SafetensorsIndex read_safetensors_index(const std::string& path);
// Tensor `entry` of `index`, read from its file (a fresh CPU tensor).
torch::Tensor read_tensor(const SafetensorsIndex& index, const SafetensorsEntry& entry);
// Only elements [first, first + count) of its flattened data, as a 1-D tensor.
torch::Tensor read_elements(const SafetensorsIndex& index, const SafetensorsEntry& entry, int64_t first, int64_t count);
// Only the box [begin, begin + size) of the elements [first, first + prod(shape)) of its data viewed as
// an array of `shape` (row-major): one read per run of consecutive elements, nothing else of the file.
// A tensor of `size`. (A column block of a matrix is read row by row; a row block in one read.)
torch::Tensor read_box(const SafetensorsIndex& index, const SafetensorsEntry& entry, int64_t first,
                       const std::vector<int64_t>& shape, const std::vector<int64_t>& begin,
                       const std::vector<int64_t>& size);
// Bytes of tensor data read_elements and read_box have read in this process so far (headers not
// counted): what a loader took from disk, for benchmarks and tests.
uint64_t tensor_bytes_read();

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
