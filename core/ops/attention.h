// Scaled dot-product attention over [B, H, T, D] tensors, using LibTorch's fused kernel where it is the
// faster one, plus the key-value cache that incremental decoding appends to.
#pragma once

namespace kuafu::ops {

// Which keys a query may see besides the causal rule.
struct AttentionMask {
  AttentionMask(torch::Tensor key_padding = {}, torch::Tensor documents = {})  // NOLINT: a padding mask alone
      : key_padding(std::move(key_padding)), documents(std::move(documents)) {}
  // [B, Tk] bool, true for a real token (left padding in batched generation); undefined: none.
  torch::Tensor key_padding;
  // [B, T] int64, the document each position belongs to when several share a row (packed training,
  // no cache): a query sees only keys of its own document; undefined: one document per row.
  torch::Tensor documents;
  // [B or 1, T] int64, each query's position in its sequence (the count of real tokens before it), for
  // models that rotate queries and keys by position (rotary embeddings); undefined: the cached keys'
  // count onwards (within its document for packed rows).
  torch::Tensor positions;
  // A sliding window: a query sees only the `window` latest keys up to itself (Mistral's); 0: all.
  int64_t window = 0;
};

// softmax(q kᵀ / √D + masks) v. `causal`: query i (aligned to the end of the keys) sees keys <= i.
// `mask.key_padding` hides padded keys; a query that sees no key at all (a padding position itself)
// gets the mean of the values instead of NaN. `mask.documents` keeps each query within its document.
torch::Tensor scaled_dot_product_attention(const torch::Tensor& q,  // [B, H, Tq, D]
                                           const torch::Tensor& k,  // [B, H, Tk, D]
                                           const torch::Tensor& v,  // [B, H, Tk, D]
                                           bool causal, double dropout = 0.0, const AttentionMask& mask = {});

// Keys and values of the tokens seen so far, per layer, held one of three ways:
// - growing (as made): each append concatenates, so a step copies the whole cache;
// - reserved (`reserve`): one buffer per tensor, appends written in place, attention given views of the
//   filled slots;
// - fixed-shape (`reserve`, then `fix_shape`): an append of one token writes at the slot a device tensor
//   names and attention is given the whole buffers, so every decoding step has the same shapes and reads
//   no host value (what a CUDA graph can replay). The caller hides the empty slots with key_padding over
//   all `capacity()` slots; a sliding window counts from the slot (AttentionCore).
struct KVCache {
  torch::Tensor keys;    // [B, H, T, D] as attention sees them (the whole buffer when fixed-shape)
  torch::Tensor values;  // [B, H, T, D]
  // Tokens appended so far, counted on the host (a replayed graph's appends are not counted).
  int64_t length() const { return capacity_ > 0 ? filled_ : (keys.defined() ? keys.size(2) : 0); }
  int64_t capacity() const { return capacity_; }
  bool fixed_shape() const { return slot_.defined(); }
  const torch::Tensor& slot() const { return slot_; }  // int64 [1] on the cache's device
  // Moves what is cached into buffers of `capacity` slots (>= length()); later appends fill them in place.
  void reserve(int64_t capacity);
  // Reserved caches only: from now on an append takes one token and writes it at slot[0].
  void fix_shape(torch::Tensor slot);
  // Appends [B, H, T, D] keys and values and returns what attention sees.
  std::pair<torch::Tensor, torch::Tensor> append(const torch::Tensor& k, const torch::Tensor& v);

 private:
  int64_t capacity_ = 0, filled_ = 0;
  torch::Tensor key_buffer_, value_buffer_;  // [B, H, capacity, D]
  torch::Tensor slot_;
};

}  // namespace kuafu::ops
