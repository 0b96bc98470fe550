#include "core/nn/attention.h"

#include <cmath>

namespace kuafu::nn {

torch::Tensor scaled_dot_product_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                           bool causal, double dropout) {
  const int64_t tq = q.size(2);
  const int64_t tk = k.size(2);
  if (causal && tq != tk) {
    // Queries are the last tq positions (decoding with a cache): mask keys after each query.
    auto rows = torch::arange(tk - tq, tk, torch::TensorOptions().dtype(torch::kInt64).device(q.device())).unsqueeze(1);
    auto cols = torch::arange(tk, torch::TensorOptions().dtype(torch::kInt64).device(q.device())).unsqueeze(0);
    torch::Tensor allowed = cols <= rows;  // [Tq, Tk], true = may attend
    return at::scaled_dot_product_attention(q, k, v, allowed, dropout, /*is_causal=*/false);
  }
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout, causal);
}

std::pair<torch::Tensor, torch::Tensor> KVCache::append(const torch::Tensor& k, const torch::Tensor& v) {
  keys = keys.defined() ? torch::cat({keys, k}, 2) : k;
  values = values.defined() ? torch::cat({values, v}, 2) : v;
  return {keys, values};
}

}  // namespace kuafu::nn
