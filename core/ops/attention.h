// Scaled dot-product attention over [B, H, T, D] tensors, using LibTorch's fused kernel where it is the
// faster one, plus the key-value cache that incremental decoding appends to.
#pragma once

namespace kuafu::ops {

// softmax(q kᵀ / √D + mask) v. `causal`: query i (aligned to the end of the keys) sees keys <= i.
// `key_padding` [B, Tk] (bool, true for a real token; undefined: none) hides padded keys; a query that
// sees no key at all (a padding position itself) gets the mean of the values instead of NaN.
torch::Tensor scaled_dot_product_attention(const torch::Tensor& q,  // [B, H, Tq, D]
                                           const torch::Tensor& k,  // [B, H, Tk, D]
                                           const torch::Tensor& v,  // [B, H, Tk, D]
                                           bool causal, double dropout = 0.0,
                                           const torch::Tensor& key_padding = {});

// Keys and values of the tokens seen so far, per layer.
struct KVCache {
  torch::Tensor keys;    // [B, H, T, D]
  torch::Tensor values;  // [B, H, T, D]
  int64_t length() const { return keys.defined() ? keys.size(2) : 0; }
  // Appends and returns the full keys and values.
  std::pair<torch::Tensor, torch::Tensor> append(const torch::Tensor& k, const torch::Tensor& v);
};

}  // namespace kuafu::ops
