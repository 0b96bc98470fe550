#include "core/nn/chunks.h"

#include <algorithm>
#include <vector>

#include <ATen/ATen.h>

namespace kuafu::nn {

torch::Tensor in_chunks(int64_t length, int64_t chunk, int64_t dim, const std::function<torch::Tensor(int64_t start, int64_t n)>& body) {
  if (chunk <= 0 || chunk >= length) return body(0, length);
  std::vector<torch::Tensor> parts;
  for (int64_t start = 0; start < length; start += chunk) parts.push_back(body(start, std::min(chunk, length - start)));
  return at::cat(parts, dim);
}

}  // namespace kuafu::nn
