// NumPy's .npy arrays and .npz archives (a zip of .npy entries, stored or deflated; libzip reads and
// writes the zip): AlphaFold's parameter files (params_model_*.npz, keyed 'alphafold/.../module//name')
// and the reference outputs tests compare against.
#pragma once

#include <map>
#include <string>

#include <torch/types.h>

namespace kuafu::io {

// Arrays by name (an entry's name without ".npy"), in name order.
using NpzArrays = std::map<std::string, torch::Tensor>;

// Every array of the archive `path`. Little-endian or byte-sized float16/32/64, int8/16/32/64, uint8 and
// bool arrays, C or Fortran order (read into a C-contiguous tensor). kuafu::Error naming the file and the
// entry for anything else: another dtype, a truncated entry, a header that is not NumPy's.
NpzArrays read_npz(const std::string& path);

// Writes `arrays` atomically as np.savez does (stored entries, format 1.0 headers): np.load reads it.
// bfloat16 has no NumPy dtype and is refused; tensors are written from the CPU, C-contiguous.
void write_npz(const std::string& path, const NpzArrays& arrays);

// One .npy file's bytes <-> its array; `where` names it in errors.
torch::Tensor parse_npy(const std::string& bytes, const std::string& where);
std::string format_npy(const torch::Tensor& array);

}  // namespace kuafu::io
