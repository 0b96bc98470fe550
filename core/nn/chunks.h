// Work along one axis a chunk at a time, as AlphaFold's inference chunks its attention, transitions and
// products: the same result, with the temporaries of one chunk alive at a time.
#pragma once

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>

namespace kuafu::nn {

// body(0, length) when `chunk` <= 0 or covers `length`; else body(start, n) over consecutive pieces of at
// most `chunk` entries, their results concatenated along `dim`.
// Without gradients the pieces are written into the result as they come (no second copy of it).
torch::Tensor in_chunks(int64_t length, int64_t chunk, int64_t dim, const std::function<torch::Tensor(int64_t start, int64_t n)>& body);

}  // namespace kuafu::nn
