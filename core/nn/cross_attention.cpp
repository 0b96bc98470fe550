#include "core/nn/cross_attention.h"

#include <cmath>

#include "core/ops/attention.h"
#include "core/util/error.h"

namespace kuafu::nn {

CrossAttentionImpl::CrossAttentionImpl(const CrossAttentionSpec& s, const parallel::ModelOptions& options) : spec(s) {
  const parallel::TensorParallel& tp = options.tp;
  if (spec.cross_attention_dim == 0) spec.cross_attention_dim = spec.query_dim;
  KUAFU_CHECK(spec.query_dim > 0 && spec.cross_attention_dim > 0 && spec.heads > 0 && spec.dim_head > 0,
              "an attention layer needs positive widths and heads (query_dim ", spec.query_dim,
              ", cross_attention_dim ", spec.cross_attention_dim, ", heads ", spec.heads, ", dim_head ", spec.dim_head,
              ")");
  KUAFU_CHECK(spec.heads % tp.feature_blocks() == 0, "the ", spec.heads, " attention heads must divide by the ",
              tp.feature_blocks(), " blocks parallel.tensor.mode = \"", parallel::mode_name(tp.spec.mode),
              "\" (parallel.tensor.size = ", tp.size(), ") cuts them into");
  local_heads = spec.heads / tp.feature_blocks();
  const int64_t inner = spec.heads * spec.dim_head;
  auto linear = [&](int64_t in, int64_t out, bool bias, parallel::Cut cut) {
    return parallel::make_linear(options, parallel::LinearSpec{in, out, bias, parallel::WeightOrder::kOutIn}, cut);
  };
  to_q = linear(spec.query_dim, inner, spec.bias, parallel::Cut::kColumn);
  to_k = linear(spec.cross_attention_dim, inner, spec.bias, parallel::Cut::kColumn);
  to_v = linear(spec.cross_attention_dim, inner, spec.bias, parallel::Cut::kColumn);
  out = linear(inner, spec.query_dim, spec.out_bias, parallel::Cut::kRow);
  register_module("to_q", to_q.ptr());
  register_module("to_k", to_k.ptr());
  register_module("to_v", to_v.ptr());
  to_out = register_module("to_out", torch::nn::ModuleList());
  to_out->push_back(out.ptr());  // "to_out.0"
  dropout = torch::nn::Dropout(spec.dropout);
  to_out->push_back(dropout);    // "to_out.1"
}

torch::Tensor CrossAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& context,
                                          const torch::Tensor& key_mask) {
  KUAFU_CHECK(x.dim() == 3, "attention takes x [B, N, C], got ", x.sizes());
  KUAFU_CHECK(context.defined() || spec.cross_attention_dim == spec.query_dim,
              "self-attention (no context) needs cross_attention_dim (", spec.cross_attention_dim,
              ") == query_dim (", spec.query_dim, "); pass the context [B, M, ", spec.cross_attention_dim, "]");
  const torch::Tensor& source = context.defined() ? context : x;  // [B, M, C_context]
  KUAFU_CHECK(source.dim() == 3 && source.size(0) == x.size(0), "attention's context is [B, M, C] with x's batch ",
              x.size(0), ", got ", source.sizes());
  const int64_t b = x.size(0), n = x.size(1), m = source.size(1);

  auto split_heads = [&](const torch::Tensor& y) {  // [B, T, h D] -> [B, h, T, D] over this rank's heads
    KUAFU_CHECK(y.size(2) == local_heads * spec.dim_head, "attention projected to ", y.size(2), " features, not ",
                local_heads, " heads x ", spec.dim_head);
    return y.view({b, y.size(1), local_heads, spec.dim_head}).transpose(1, 2);
  };
  const torch::Tensor q = split_heads(to_q.forward(x));       // [B, h, N, D]
  const torch::Tensor k = split_heads(to_k.forward(source));  // [B, h, M, D]
  const torch::Tensor v = split_heads(to_v.forward(source));  // [B, h, M, D]

  ops::AttentionMask mask;
  if (key_mask.defined()) {
    KUAFU_CHECK(key_mask.dim() == 2 && key_mask.size(0) == b && key_mask.size(1) == m,
                "attention's key mask is [B, M] = [", b, ", ", m, "] (true for a real key), got ", key_mask.sizes());
    mask.key_padding = key_mask.to(torch::kBool);  // [B, M]
  }
  // Not nn::AttentionCore: parallelize may turn on its sequence parallelism, which would cut the
  // context's keys as if they were positions of x.
  const torch::Tensor y =
      ops::scaled_dot_product_attention(q, k, v, /*causal=*/false, /*dropout=*/0.0, mask);  // [B, h, N, D]
  return dropout(out.forward(y.transpose(1, 2).reshape({b, n, local_heads * spec.dim_head})));  // [B, N, query_dim]
}

}  // namespace kuafu::nn
