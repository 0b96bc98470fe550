#include "core/nn/chunks.h"

#include <algorithm>
#include <vector>

#include <ATen/ATen.h>

namespace kuafu::nn {
namespace {

// body(start, n) over in_chunks's pieces.
void for_chunks(int64_t length, int64_t chunk, const std::function<void(int64_t start, int64_t n)>& body) {
  if (chunk <= 0 || chunk >= length) return body(0, length);
  for (int64_t start = 0; start < length; start += chunk) body(start, std::min(chunk, length - start));
}

}  // namespace

torch::Tensor in_chunks(int64_t length, int64_t chunk, int64_t dim, const std::function<torch::Tensor(int64_t start, int64_t n)>& body) {
  if (chunk <= 0 || chunk >= length) return body(0, length);
  if (!at::GradMode::is_enabled()) {
    // Without gradients each piece goes into the result as it comes: one copy of it alive, not the pieces
    // and their concatenation.
    torch::Tensor out;
    for_chunks(length, chunk, [&](int64_t start, int64_t n) {
      const torch::Tensor piece = body(start, n);
      const int64_t axis = dim < 0 ? dim + piece.dim() : dim;
      if (!out.defined()) {
        std::vector<int64_t> sizes = piece.sizes().vec();
        sizes[static_cast<size_t>(axis)] = length;
        out = at::empty(sizes, piece.options());
      }
      out.narrow(axis, start, n).copy_(piece);
    });
    return out;
  }
  std::vector<torch::Tensor> parts;
  for_chunks(length, chunk, [&](int64_t start, int64_t n) { parts.push_back(body(start, n)); });
  return at::cat(parts, dim);
}

}  // namespace kuafu::nn
