#include "core/nn/transformer_block.h"

#include "core/nn/language_model.h"
#include "core/ops/gelu.h"
#include "core/util/error.h"

namespace kuafu::nn {

torch::Tensor activate(Activation activation, const torch::Tensor& x) {
  switch (activation) {
    case Activation::kGelu: return torch::gelu(x);
    case Activation::kGeluTanh: return ops::gelu_tanh(x);
    case Activation::kQuickGelu: return x * torch::sigmoid(1.702 * x);
    case Activation::kRelu: return torch::relu(x);
    case Activation::kSilu: return torch::silu(x);
  }
  fail("unknown activation");
}

torch::Tensor AttentionCoreImpl::forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                         ops::KVCache* cache, const ops::AttentionMask& mask) {
  const int64_t b = q.size(0), t = q.size(1), width = q.size(2), d = width / heads;
  auto split_heads = [&](const torch::Tensor& y, int64_t h) {  // [B, T, h D] -> [B, h, T, D]
    return y.view({b, y.size(1), h, d}).transpose(1, 2);
  };
  torch::Tensor keys = split_heads(k, kv_heads), values = split_heads(v, kv_heads);
  if (cache) std::tie(keys, values) = cache->append(keys, values);
  if (kv_heads != heads) {  // each key-value head serves heads / kv_heads query heads in a row
    // [B, kv, T, D] -> [B, kv, g, T, D] -> [B, kv g, T, D]: repeat_interleave's result, through a view (no index
    // tensor, nothing read on the host, so a CUDA graph can capture it)
    auto repeat_heads = [&](const torch::Tensor& y) {
      const int64_t rows = y.size(0), t = y.size(2), d = y.size(3);
      return y.unsqueeze(2).expand({rows, kv_heads, heads / kv_heads, t, d}).reshape({rows, heads, t, d});
    };
    keys = repeat_heads(keys), values = repeat_heads(values);
  }
  ops::AttentionMask masks = mask;
  masks.window = window;
  if (cache && cache->fixed_shape() && window > 0) {
    // The query sits at the cache's slot, not at the end of the keys: hide the slots `window` or more before it.
    const torch::Tensor slots = torch::arange(keys.size(2), cache->slot().options());  // [C]
    const torch::Tensor in_window = (slots > cache->slot() - window).unsqueeze(0);         // [1, C]
    masks.key_padding = masks.key_padding.defined() ? masks.key_padding.logical_and(in_window) : in_window.expand({b, -1});
    masks.window = 0;
  }
  const bool causal_now = causal && !(cache && t == 1);  // one new token may attend to everything cached
  const double p = is_training() ? dropout : 0.0;
  torch::Tensor y;
  if (sequence.enabled()) {
    KUAFU_CHECK(!cache && !mask.key_padding.defined() && window == 0,
                "sequence parallelism runs without a key-value cache, padding masks or a sliding window (training on full or packed rows)");
    y = parallel::sequence::attention(split_heads(q, heads), keys, values, causal_now, p, sequence, mask.documents);
  } else {
    y = ops::scaled_dot_product_attention(split_heads(q, heads), keys, values, causal_now, p, masks);
  }
  return y.transpose(1, 2).reshape({b, t, width});
}

TransformerBlockImpl::TransformerBlockImpl(const TransformerBlockSpec& s, const parallel::ModelOptions& options) : spec(s) {
  const parallel::TensorParallel& tp = options.tp;
  KUAFU_CHECK(s.hidden > 0 && s.heads > 0 && (s.head_dim > 0 || s.hidden % s.heads == 0), "a transformer block's width (",
              s.hidden, ") must divide by its attention heads (", s.heads, ") unless head_dim is given");
  const int64_t d = s.head_width(), kv_heads = s.key_value_heads();
  KUAFU_CHECK(s.heads % kv_heads == 0, "the ", s.heads, " attention heads must divide by the ", kv_heads, " key-value heads");
  KUAFU_CHECK(kv_heads % tp.feature_blocks() == 0, "the ", kv_heads, " key-value heads must divide by the ", tp.feature_blocks(),
              " blocks parallel.tensor.mode = \"", parallel::mode_name(tp.spec.mode), "\" cuts them into");
  if (s.rotary) {
    validate(*s.rotary, "rotary embeddings: ");
    KUAFU_CHECK(s.rotary->head_dim == d, "rotary embeddings rotate ", s.rotary->head_dim, " features of heads ", d, " wide");
  }
  const BlockNames& n = s.names;
  auto linear = [&](int64_t in, int64_t out, parallel::Cut cut, bool bias, int64_t stride = 1) {
    return parallel::make_linear(options, parallel::LinearSpec{in, out, bias, s.weight_order, stride}, cut);
  };
  auto norm = [&](int64_t width) {
    return s.rms_norm ? parallel::make_rms_norm(options, width, s.norm_eps) : parallel::make_layer_norm(options, width, s.norm_eps);
  };
  norm_1 = norm(s.hidden);
  register_at(n.norm_1, norm_1.ptr());
  if (!n.qkv.empty()) {
    KUAFU_CHECK(kv_heads == s.heads && d * s.heads == s.hidden, "a fused q|k|v projection takes one key-value head per query "
                                                               "head, heads x head_dim = hidden");
    qkv = linear(s.hidden, 3 * s.hidden, parallel::Cut::kColumn, s.qkv_bias, /*stride=*/3);  // cut per q|k|v segment
    register_at(n.qkv, qkv.ptr());
  } else {
    const std::tuple<torch::nn::AnyModule*, const std::string*, int64_t> separate[] = {
        {&q, &n.q, s.heads}, {&k, &n.k, kv_heads}, {&v, &n.v, kv_heads}};
    for (const auto& [layer, path, heads] : separate) {
      *layer = linear(s.hidden, heads * d, parallel::Cut::kColumn, s.qkv_bias);
      register_at(*path, layer->ptr());
    }
  }
  attention_out = linear(s.heads * d, s.hidden, parallel::Cut::kRow, s.out_bias);
  register_at(n.attention_out, attention_out.ptr());
  if (s.qk_norm) {
    q_norm = parallel::make_head_norm(options, d, s.norm_eps);
    register_at(n.q_norm, q_norm.ptr());
    k_norm = parallel::make_head_norm(options, d, s.norm_eps);
    register_at(n.k_norm, k_norm.ptr());
  }
  norm_2 = norm(s.hidden);
  register_at(n.norm_2, norm_2.ptr());
  if (s.gated_mlp) {
    fc_gate = linear(s.hidden, s.intermediate, parallel::Cut::kColumn, s.mlp_bias);
    register_at(n.fc_gate, fc_gate.ptr());
  }
  fc_in = linear(s.hidden, s.intermediate, parallel::Cut::kColumn, s.mlp_bias);
  register_at(n.fc_in, fc_in.ptr());
  fc_out = linear(s.intermediate, s.hidden, parallel::Cut::kRow, s.mlp_bias);
  register_at(n.fc_out, fc_out.ptr());
  attention = register_module("attention_core", AttentionCore(s.heads / tp.feature_blocks(), s.causal, s.attention_dropout,
                                                              kv_heads / tp.feature_blocks(), s.window));
  dropout = register_module("dropout", torch::nn::Dropout(s.dropout));
}

void TransformerBlockImpl::register_at(const std::string& path, const std::shared_ptr<torch::nn::Module>& layer) {
  KUAFU_CHECK(!path.empty(), "a transformer block layer needs its name (BlockNames)");
  torch::nn::Module* parent = this;
  size_t start = 0;
  for (size_t dot = path.find('.'); dot != std::string::npos; start = dot + 1, dot = path.find('.', start)) {
    const std::string name = path.substr(start, dot - start);
    std::shared_ptr<torch::nn::Module> child;
    for (const auto& item : parent->named_children()) {
      if (item.key() == name) child = item.value();
    }
    if (!child) child = parent->register_module(name, std::make_shared<torch::nn::Module>());
    parent = child.get();
  }
  parent->register_module(path.substr(start), layer);
}

std::pair<torch::Tensor, torch::Tensor> TransformerBlockImpl::angles_of(const torch::Tensor& x, const ops::KVCache* cache,
                                                                       const ops::AttentionMask& mask) {
  const parallel::sequence::SequenceParallel& sequence = attention->sequence;
  // Under sequence parallelism x holds this rank's chunk of the positions: the angles are the whole row's
  // (packed rows' documents are whole on every rank; "dynamic" frequencies see the row's longest position),
  // cut as the stream is.
  const int64_t length = sequence.enabled() ? x.size(1) * sequence.size : x.size(1);
  torch::Tensor positions = mask.positions;
  if (!positions.defined()) {
    positions = mask.documents.defined()
                    ? positions_in_documents(mask.documents)
                    : torch::arange(cache ? cache->length() : 0, (cache ? cache->length() : 0) + length,
                                    torch::TensorOptions(torch::kInt64).device(x.device()))
                          .unsqueeze(0);
  }
  const auto [cos, sin] = rotary_angles(*spec.rotary, positions, x.scalar_type());  // [B or 1, length, D]
  return {parallel::sequence::local_chunk(cos, 1, sequence), parallel::sequence::local_chunk(sin, 1, sequence)};
}

torch::Tensor TransformerBlockImpl::place_heads(const torch::Tensor& x, torch::nn::AnyModule& norm,
                                                const std::pair<torch::Tensor, torch::Tensor>& angles) {
  if (norm.is_empty() && !spec.rotary) return x;
  const int64_t d = spec.head_width();
  torch::Tensor heads = x.view({x.size(0), x.size(1), x.size(2) / d, d});  // [B, T, h, D]
  if (!norm.is_empty()) heads = norm.forward(heads);
  if (spec.rotary) heads = apply_rotary(heads, angles.first, angles.second);
  return heads.reshape({x.size(0), x.size(1), x.size(2)});
}

torch::Tensor TransformerBlockImpl::attend(const torch::Tensor& x, ops::KVCache* cache, const ops::AttentionMask& mask) {
  const std::pair<torch::Tensor, torch::Tensor> angles = spec.rotary ? angles_of(x, cache, mask) : std::pair<torch::Tensor, torch::Tensor>{};
  torch::Tensor queries, keys, values;
  if (!qkv.is_empty()) {
    const auto parts = qkv.forward(x).chunk(3, /*dim=*/2);  // this rank's heads of q | k | v
    queries = parts[0], keys = parts[1], values = parts[2];
  } else {
    queries = q.forward(x), keys = k.forward(x), values = v.forward(x);
  }
  const torch::Tensor y = attention(place_heads(queries, q_norm, angles), place_heads(keys, k_norm, angles), values, cache, mask);
  return dropout(attention_out.forward(y));
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x, ops::KVCache* cache, const ops::AttentionMask& mask) {
  auto mlp = [&](const torch::Tensor& h) {
    const torch::Tensor a = spec.gated_mlp ? activate(spec.activation, fc_gate.forward(h)) * fc_in.forward(h)
                                           : activate(spec.activation, fc_in.forward(h));
    return dropout(fc_out.forward(a));
  };
  if (spec.pre_norm) {
    const torch::Tensor h = x + attend(norm_1.forward(x), cache, mask);
    return h + mlp(norm_2.forward(h));
  }
  const torch::Tensor h = norm_1.forward(x + attend(x, cache, mask));
  return norm_2.forward(h + mlp(h));
}

}  // namespace kuafu::nn
