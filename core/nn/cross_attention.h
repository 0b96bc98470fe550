// Diffusers' Attention (diffusers.models.attention_processor.Attention): multi-head attention of queries
// from x over keys and values from a context of another width (cross-attention on text embeddings in
// Stable Diffusion's UNet) or from x itself. Megatron tensor parallelism comes from the layer factories.
#pragma once

#include "core/parallel/tensor/factory.h"

namespace kuafu::nn {

// Attention(query_dim, cross_attention_dim, heads, dim_head, dropout, bias, out_bias) of diffusers.
struct CrossAttentionSpec {
  int64_t query_dim = 0;            // width of x and of the output
  int64_t cross_attention_dim = 0;  // width of the context; 0: query_dim
  int64_t heads = 8, dim_head = 64; // inner width heads x dim_head
  bool bias = false;                // on to_q, to_k, to_v
  bool out_bias = true;             // on to_out.0
  double dropout = 0;               // after to_out.0 (to_out.1), while training
};

// softmax(q kᵀ/√dim_head + mask) v with q = to_q(x), k = to_k(context), v = to_v(context), then to_out.0.
// Parameters, as diffusers names them: to_q.weight [inner, query_dim], to_k.weight and to_v.weight
// [inner, cross_attention_dim] (with .bias [inner] when spec.bias), to_out.0.weight [query_dim, inner]
// and to_out.0.bias [query_dim]; they start at zero, as the factories' layers do, for the model to
// initialise. Under tensor parallelism to_q, to_k and to_v are column layers (each rank holds whole
// heads) and to_out.0 a row layer, so attention runs locally on a rank's heads; x and the context
// come in the mode's residual-stream layout (whole in serial and 1D).
struct CrossAttentionImpl : torch::nn::Module {
  explicit CrossAttentionImpl(const CrossAttentionSpec& spec,
                              const parallel::ModelOptions& options = {});
  // x [B, N, query_dim]; context [B, M, cross_attention_dim] (undefined: self-attention over x, which
  // needs cross_attention_dim == query_dim); key_mask [B, M] bool, true for a real key (undefined:
  // every key). -> [B, N, query_dim]. A query whose keys are all masked gets the mean of the values.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context = {}, const torch::Tensor& key_mask = {});

  CrossAttentionSpec spec;
  int64_t local_heads;  // heads on this rank
  torch::nn::AnyModule to_q, to_k, to_v, out;
  torch::nn::ModuleList to_out{nullptr};  // "0": out, "1": the dropout, as diffusers' ModuleList
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(CrossAttention);

}  // namespace kuafu::nn
