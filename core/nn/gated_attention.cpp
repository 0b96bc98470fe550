#include "core/nn/gated_attention.h"

#include <cmath>

#include <torch/torch.h>

#include "core/nn/chunks.h"
#include "core/nn/torch_init.h"
#include "core/util/error.h"

namespace kuafu::nn {
namespace {

}  // namespace

void glorot_uniform(torch::Tensor& w, int64_t fan_in, int64_t fan_out) {
  const double limit = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  torch::NoGradGuard no_grad;
  w.uniform_(-limit, limit);
}

GatedAttentionImpl::GatedAttentionImpl(const GatedAttentionSpec& s, const torch::TensorOptions& options) : spec(s) {
  if (spec.key_width == 0) spec.key_width = spec.query_width;
  if (spec.output_width == 0) spec.output_width = spec.query_width;
  KUAFU_CHECK(spec.query_width > 0 && spec.heads > 0 && spec.head_width > 0, "attention sizes must be positive (query ",
              spec.query_width, ", heads ", spec.heads, ", head width ", spec.head_width, ")");
  const int64_t h = spec.heads, c = spec.head_width;
  query_w = register_parameter("query_w", torch::zeros({spec.query_width, h, c}, options));
  key_w = register_parameter("key_w", torch::zeros({spec.key_width, h, c}, options));
  value_w = register_parameter("value_w", torch::zeros({spec.key_width, h, c}, options));
  if (spec.gated) {
    gating_w = register_parameter("gating_w", torch::zeros({spec.query_width, h, c}, options));
    gating_b = register_parameter("gating_b", torch::zeros({h, c}, options));
  }
  output_w = register_parameter("output_w", torch::zeros({h, c, spec.output_width}, options));
  output_b = register_parameter("output_b", torch::zeros({spec.output_width}, options));
}

void GatedAttentionImpl::initialize(bool zero_output) {
  initialize_by_module(*this, [zero_output](const torch::nn::Module& owner, const std::string& name, torch::Tensor& value) {
    static_cast<const GatedAttentionImpl&>(owner).initial_value(name, value, zero_output);
    return true;
  });
}

void GatedAttentionImpl::initial_value(const std::string& name, torch::Tensor& value, bool zero_output) const {
  const int64_t inner = spec.heads * spec.head_width;
  if (name == "query_w") {
    glorot_uniform(value, spec.query_width, inner);
  } else if (name == "key_w" || name == "value_w") {
    glorot_uniform(value, spec.key_width, inner);
  } else if (name == "output_w" && !zero_output) {
    glorot_uniform(value, inner, spec.output_width);
  } else {
    torch::NoGradGuard no_grad;
    value.fill_(name == "gating_b" ? 1.0 : 0.0);  // the gate open, the output closed
  }
}

torch::Tensor leading_slice(const torch::Tensor& bias, int64_t leading, int64_t start, int64_t length) {
  const int64_t axis = bias.dim() - (leading + 3);  // where the first leading axis falls, aligned from the right
  if (axis < 0 || bias.size(axis) == 1) return bias;
  return bias.narrow(axis, start, length);
}

torch::Tensor GatedAttentionImpl::forward(const torch::Tensor& queries, const torch::Tensor& keys_values,
                                          const std::vector<torch::Tensor>& biases, int64_t chunk) {
  const int64_t leading = queries.dim() - 2;
  if (chunk <= 0 || leading < 1 || queries.size(0) <= chunk) return attend(queries, keys_values, biases);
  return in_chunks(queries.size(0), chunk, 0, [&](int64_t start, int64_t length) {
    std::vector<torch::Tensor> sliced;
    for (const torch::Tensor& bias : biases) sliced.push_back(leading_slice(bias, leading, start, length));
    return attend(queries.narrow(0, start, length), keys_values.narrow(0, start, length), sliced);
  });
}

torch::Tensor GatedAttentionImpl::attend(const torch::Tensor& queries, const torch::Tensor& keys_values,
                                         const std::vector<torch::Tensor>& biases) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(spec.head_width));
  const torch::Tensor q = torch::einsum("...qa,ahc->...qhc", {queries, query_w}) * scale;  // [*, Q, H, c]
  const torch::Tensor k = torch::einsum("...ka,ahc->...khc", {keys_values, key_w});        // [*, K, H, c]
  const torch::Tensor v = torch::einsum("...ka,ahc->...khc", {keys_values, value_w});      // [*, K, H, c]
  // Without gradients (inference) the logits take their biases and clipping in place: one [*, H, Q, K]
  // buffer where each step would make another.
  const bool inference = !at::GradMode::is_enabled();
  torch::Tensor logits = torch::einsum("...qhc,...khc->...hqk", {q, k});                   // [*, H, Q, K]
  for (const torch::Tensor& bias : biases) logits = inference ? logits.add_(bias) : logits + bias;
  // Clipped as AlphaFold 2.3 under current JAX clips them: a query whose every key is masked (-1e9) gets
  // the values' plain mean, and no gradient, since its logits no longer depend on q and k in floating point.
  if (!biases.empty() && inference) {
    logits.clamp_(-1e8, 1e8);
  } else if (!biases.empty()) {
    // clamp() would keep the logits for its backward: one more [*, H, Q, K] tensor, the largest a block
    // saves. Only a mask's -1e9 reaches the bound, so the same values and gradients come from a select on
    // the masks' own small shapes (the biases that need no gradient; a learned bias never nears 1e8).
    torch::Tensor masked;
    for (const torch::Tensor& bias : biases) {
      if (bias.requires_grad()) continue;
      const torch::Tensor below = bias < -1e8;
      masked = masked.defined() ? masked.logical_or(below) : below;
    }
    if (masked.defined()) logits = torch::where(masked, -1e8, logits);
  }
  torch::Tensor weights = torch::softmax(logits, -1);
  logits.reset();
  torch::Tensor average = torch::einsum("...hqk,...khc->...qhc", {weights, v});  // [*, Q, H, c]
  weights.reset();
  if (spec.gated) {
    const torch::Tensor gate = torch::einsum("...qa,ahc->...qhc", {queries, gating_w});
    average = inference ? average.mul_(gate.add_(gating_b).sigmoid_()) : average * torch::sigmoid(gate + gating_b);
  }
  return torch::einsum("...qhc,hco->...qo", {average, output_w}) + output_b;  // [*, Q, out]
}

}  // namespace kuafu::nn
