#include "apps/fastfold/evoformer.h"

#include <torch/torch.h>

#include "core/util/error.h"

namespace kuafu::fold {
namespace {

// The additive bias that keeps attention off padding: 0 for a real key, -1e9 for a masked one.
// mask [B, K] -> [B, 1, 1, K] (broadcast over heads and queries).
torch::Tensor key_mask_bias(const torch::Tensor& mask) { return (1e9 * (mask - 1.0)).unsqueeze(1).unsqueeze(1); }

nn::GatedAttention make_attention(torch::nn::Module& owner, int64_t channels, int64_t heads) {
  KUAFU_CHECK(channels % heads == 0, "attention channels (", channels, ") must divide by its heads (", heads, ")");
  return owner.register_module("attention", nn::GatedAttention(nn::GatedAttentionSpec{channels, channels, heads, channels / heads}));
}

}  // namespace

AfLinearImpl::AfLinearImpl(int64_t in, int64_t out, bool with_bias) {
  weights = register_parameter("weights", torch::zeros({in, out}));
  if (with_bias) bias = register_parameter("bias", torch::zeros({out}));
}

torch::Tensor AfLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = torch::matmul(x, weights);
  return bias.defined() ? y + bias : y;
}

AfLayerNormImpl::AfLayerNormImpl(int64_t channels) {
  scale = register_parameter("scale", torch::ones({channels}));
  offset = register_parameter("offset", torch::zeros({channels}));
}

torch::Tensor AfLayerNormImpl::forward(const torch::Tensor& x) {
  return torch::layer_norm(x, {x.size(-1)}, scale, offset, 1e-5);
}

MsaAttentionImpl::MsaAttentionImpl(int64_t c_m, int64_t c_z, int64_t heads, bool column) : per_column(column) {
  query_norm = register_module("query_norm", AfLayerNorm(c_m));
  if (!per_column) {
    feat_2d_norm = register_module("feat_2d_norm", AfLayerNorm(c_z));
    feat_2d_weights = register_parameter("feat_2d_weights", torch::zeros({c_z, heads}));
  }
  attention = make_attention(*this, c_m, heads);
}

torch::Tensor MsaAttentionImpl::forward(const torch::Tensor& m, const torch::Tensor& mask, const torch::Tensor& z, int64_t chunk) {
  // Column attention attends over sequences: the same maths on the transposed MSA.
  const torch::Tensor rows = per_column ? m.transpose(0, 1) : m;           // [B, K, c_m]
  const torch::Tensor row_mask = per_column ? mask.transpose(0, 1) : mask;  // [B, K]
  const torch::Tensor x = query_norm(rows);
  std::vector<torch::Tensor> biases = {key_mask_bias(row_mask)};
  if (!per_column) {
    biases.push_back(torch::einsum("qkc,ch->hqk", {feat_2d_norm(z), feat_2d_weights}));  // [H, R, R]
  }
  const torch::Tensor out = attention->forward(x, x, biases, chunk);
  return per_column ? out.transpose(0, 1) : out;
}

TransitionImpl::TransitionImpl(int64_t channels, int64_t factor) {
  input_layer_norm = register_module("input_layer_norm", AfLayerNorm(channels));
  transition1 = register_module("transition1", AfLinear(channels, factor * channels));
  transition2 = register_module("transition2", AfLinear(factor * channels, channels));
}

torch::Tensor TransitionImpl::forward(const torch::Tensor& x) {
  return transition2(torch::relu(transition1(input_layer_norm(x))));
}

OuterProductMeanImpl::OuterProductMeanImpl(int64_t c_m, int64_t c_z, int64_t c_outer) {
  layer_norm_input = register_module("layer_norm_input", AfLayerNorm(c_m));
  left_projection = register_module("left_projection", AfLinear(c_m, c_outer));
  right_projection = register_module("right_projection", AfLinear(c_m, c_outer));
  output_w = register_parameter("output_w", torch::zeros({c_outer, c_outer, c_z}));
  output_b = register_parameter("output_b", torch::zeros({c_z}));
}

torch::Tensor OuterProductMeanImpl::forward(const torch::Tensor& m, const torch::Tensor& mask) {
  const torch::Tensor real = mask.unsqueeze(-1);  // [S, R, 1]
  const torch::Tensor x = layer_norm_input(m);
  const torch::Tensor left = real * left_projection(x), right = real * right_projection(x);  // [S, R, c']
  const torch::Tensor outer = torch::einsum("sic,sje->ijce", {left, right});                 // [R, R, c', c']
  const torch::Tensor summed = torch::einsum("ijce,cef->ijf", {outer, output_w}) + output_b;  // [R, R, c_z]
  // AlphaFold divides the sum (its bias included) by the number of sequences where both are real.
  const torch::Tensor pairs = torch::einsum("si,sj->ij", {mask, mask}).unsqueeze(-1);
  return summed / (pairs + 1e-3);
}

TriangleMultiplicationImpl::TriangleMultiplicationImpl(int64_t c_z, int64_t c_hidden, bool out) : outgoing(out) {
  layer_norm_input = register_module("layer_norm_input", AfLayerNorm(c_z));
  left_projection = register_module("left_projection", AfLinear(c_z, c_hidden));
  right_projection = register_module("right_projection", AfLinear(c_z, c_hidden));
  left_gate = register_module("left_gate", AfLinear(c_z, c_hidden));
  right_gate = register_module("right_gate", AfLinear(c_z, c_hidden));
  center_layer_norm = register_module("center_layer_norm", AfLayerNorm(c_hidden));
  output_projection = register_module("output_projection", AfLinear(c_hidden, c_z));
  gating_linear = register_module("gating_linear", AfLinear(c_z, c_z));
}

torch::Tensor TriangleMultiplicationImpl::forward(const torch::Tensor& z, const torch::Tensor& mask) {
  const torch::Tensor real = mask.unsqueeze(-1);  // [R, R, 1]
  const torch::Tensor x = layer_norm_input(z);
  const torch::Tensor a = real * left_projection(x) * torch::sigmoid(left_gate(x));    // [R, R, c]
  const torch::Tensor b = real * right_projection(x) * torch::sigmoid(right_gate(x));  // [R, R, c]
  // Outgoing: edge ij from edges ik and jk; incoming: from edges ki and kj.
  const torch::Tensor update = outgoing ? torch::einsum("ikc,jkc->ijc", {a, b}) : torch::einsum("kjc,kic->ijc", {a, b});
  return output_projection(center_layer_norm(update)) * torch::sigmoid(gating_linear(x));
}

TriangleAttentionImpl::TriangleAttentionImpl(int64_t c_z, int64_t heads, bool ending) : ending_node(ending) {
  query_norm = register_module("query_norm", AfLayerNorm(c_z));
  feat_2d_weights = register_parameter("feat_2d_weights", torch::zeros({c_z, heads}));
  attention = make_attention(*this, c_z, heads);
}

torch::Tensor TriangleAttentionImpl::forward(const torch::Tensor& z, const torch::Tensor& mask, int64_t chunk) {
  // The ending node's attention is the starting node's on the transposed pair.
  const torch::Tensor pair = ending_node ? z.transpose(0, 1) : z;             // [R, R, c_z]
  const torch::Tensor pair_mask = ending_node ? mask.transpose(0, 1) : mask;  // [R, R]
  const torch::Tensor x = query_norm(pair);
  const torch::Tensor triangle = torch::einsum("qkc,ch->hqk", {x, feat_2d_weights});  // [H, R, R]
  const torch::Tensor out = attention->forward(x, x, {key_mask_bias(pair_mask), triangle}, chunk);
  return ending_node ? out.transpose(0, 1) : out;
}

void load_alphafold_parameters(torch::nn::Module& module, const io::NpzArrays& params, const std::string& prefix, int64_t block) {
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    // "attention.query_w" -> "<prefix>/attention//query_w"; "query_norm.scale" -> "<prefix>/query_norm//scale".
    const std::string& name = item.key();
    const size_t last = name.rfind('.');
    std::string path = last == std::string::npos ? "" : "/" + name.substr(0, last);
    for (char& c : path) c = c == '.' ? '/' : c;
    const std::string key = prefix + path + "//" + name.substr(last == std::string::npos ? 0 : last + 1);
    const auto found = params.find(key);
    KUAFU_CHECK(found != params.end(), "AlphaFold parameters: no array '", key, "' for ", name);
    const torch::Tensor value = block >= 0 ? found->second[block] : found->second;
    KUAFU_CHECK(value.sizes() == item.value().sizes(), "AlphaFold parameters: '", key, "' is ", value.sizes(), ", the model's ",
                name, " is ", item.value().sizes());
    item.value().copy_(value);
  }
}

}  // namespace kuafu::fold
