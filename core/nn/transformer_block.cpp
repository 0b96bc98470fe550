#include "core/nn/transformer_block.h"

#include "core/util/error.h"

namespace kuafu::nn {

torch::Tensor activate(Activation activation, const torch::Tensor& x) {
  switch (activation) {
    case Activation::kGelu: return torch::gelu(x);
    case Activation::kGeluTanh: return torch::gelu(x, "tanh");
    case Activation::kQuickGelu: return x * torch::sigmoid(1.702 * x);
    case Activation::kRelu: return torch::relu(x);
  }
  fail("unknown activation");
}

torch::Tensor AttentionCoreImpl::forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                         ops::KVCache* cache, const ops::AttentionMask& mask) {
  const int64_t b = q.size(0), t = q.size(1), width = q.size(2);
  auto split_heads = [&](const torch::Tensor& y) {  // [B, T, h D] -> [B, h, T, D]
    return y.view({b, y.size(1), heads, width / heads}).transpose(1, 2);
  };
  torch::Tensor keys = split_heads(k), values = split_heads(v);
  if (cache) std::tie(keys, values) = cache->append(keys, values);
  const bool causal_now = causal && !(cache && t == 1);  // one new token may attend to everything cached
  const double p = is_training() ? dropout : 0.0;
  torch::Tensor y;
  if (sequence.enabled()) {
    KUAFU_CHECK(!cache && !mask.key_padding.defined(),
                "sequence parallelism runs without a key-value cache or padding masks (training on full or packed rows)");
    y = parallel::sequence::attention(split_heads(q), keys, values, causal_now, p, sequence, mask.documents);
  } else {
    y = ops::scaled_dot_product_attention(split_heads(q), keys, values, causal_now, p, mask);
  }
  return y.transpose(1, 2).reshape({b, t, width});
}

TransformerBlockImpl::TransformerBlockImpl(const TransformerBlockSpec& s, const parallel::ModelOptions& options) : spec(s) {
  const parallel::TensorParallel& tp = options.tp;
  KUAFU_CHECK(s.hidden > 0 && s.heads > 0 && s.hidden % s.heads == 0, "a transformer block's width (", s.hidden,
              ") must divide by its attention heads (", s.heads, ")");
  KUAFU_CHECK(s.heads % tp.feature_blocks() == 0, "the ", s.heads, " attention heads must divide by the ",
              tp.feature_blocks(), " blocks parallel.tensor.mode = \"", parallel::mode_name(tp.spec.mode),
              "\" cuts them into");
  const BlockNames& n = s.names;
  auto linear = [&](int64_t in, int64_t out, parallel::Cut cut, int64_t stride = 1) {
    return parallel::make_linear(options, parallel::LinearSpec{in, out, /*bias=*/true, s.weight_order, stride}, cut);
  };
  norm_1 = parallel::make_layer_norm(options, s.hidden, s.norm_eps);
  register_at(n.norm_1, norm_1.ptr());
  if (!n.qkv.empty()) {
    qkv = linear(s.hidden, 3 * s.hidden, parallel::Cut::kColumn, /*stride=*/3);  // cut per q|k|v segment
    register_at(n.qkv, qkv.ptr());
  } else {
    const std::pair<torch::nn::AnyModule*, const std::string*> separate[] = {{&q, &n.q}, {&k, &n.k}, {&v, &n.v}};
    for (const auto& [layer, path] : separate) {
      *layer = linear(s.hidden, s.hidden, parallel::Cut::kColumn);
      register_at(*path, layer->ptr());
    }
  }
  attention_out = linear(s.hidden, s.hidden, parallel::Cut::kRow);
  register_at(n.attention_out, attention_out.ptr());
  norm_2 = parallel::make_layer_norm(options, s.hidden, s.norm_eps);
  register_at(n.norm_2, norm_2.ptr());
  fc_in = linear(s.hidden, s.intermediate, parallel::Cut::kColumn);
  register_at(n.fc_in, fc_in.ptr());
  fc_out = linear(s.intermediate, s.hidden, parallel::Cut::kRow);
  register_at(n.fc_out, fc_out.ptr());
  attention = register_module("attention_core", AttentionCore(s.heads / tp.feature_blocks(), s.causal, s.attention_dropout));
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

torch::Tensor TransformerBlockImpl::attend(const torch::Tensor& x, ops::KVCache* cache, const ops::AttentionMask& mask) {
  torch::Tensor y;
  if (!qkv.is_empty()) {
    const auto parts = qkv.forward(x).chunk(3, /*dim=*/2);  // this rank's heads of q | k | v
    y = attention(parts[0], parts[1], parts[2], cache, mask);
  } else {
    y = attention(q.forward(x), k.forward(x), v.forward(x), cache, mask);
  }
  return dropout(attention_out.forward(y));
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x, ops::KVCache* cache, const ops::AttentionMask& mask) {
  auto mlp = [&](const torch::Tensor& h) { return dropout(fc_out.forward(activate(spec.activation, fc_in.forward(h)))); };
  if (spec.pre_norm) {
    const torch::Tensor h = x + attend(norm_1.forward(x), cache, mask);
    return h + mlp(norm_2.forward(h));
  }
  const torch::Tensor h = norm_1.forward(x + attend(x, cache, mask));
  return norm_2.forward(h + mlp(h));
}

}  // namespace kuafu::nn
