#include "apps/fastfold/evoformer.h"

#include <cmath>

#include <torch/torch.h>

#include "core/nn/chunks.h"
#include "core/nn/torch_init.h"
#include "core/util/error.h"

namespace kuafu::fold {
namespace {

// The additive bias that keeps attention off padding: 0 for a real key, -1e9 for a masked one.
// mask [B, K] -> [B, 1, 1, K] (broadcast over heads and queries).
torch::Tensor key_mask_bias(const torch::Tensor& mask) { return (1e9 * (mask - 1.0)).unsqueeze(1).unsqueeze(1); }

nn::GatedAttention make_attention(torch::nn::Module& owner, int64_t channels, int64_t heads, const torch::Device& device) {
  KUAFU_CHECK(channels % heads == 0, "attention channels (", channels, ") must divide by its heads (", heads, ")");
  return owner.register_module("attention",
                               nn::GatedAttention(nn::GatedAttentionSpec{channels, channels, heads, channels / heads}, device));
}

}  // namespace

AfLinearImpl::AfLinearImpl(int64_t in, int64_t out, AfInit kind, bool with_bias)
    : AfLinearImpl(in, out, torch::kCPU, kind, with_bias) {}

AfLinearImpl::AfLinearImpl(int64_t in, int64_t out, const torch::Device& device, AfInit kind, bool with_bias) : init(kind) {
  weights = register_parameter("weights", torch::zeros({in, out}, device));
  if (with_bias) bias = register_parameter("bias", torch::zeros({out}, device));
}

void AfLinearImpl::initial_value(const std::string& name, torch::Tensor& value) const {
  torch::NoGradGuard no_grad;
  if (name == "bias") {
    value.fill_(init == AfInit::kGating ? 1.0 : 0.0);
    return;
  }
  if (init == AfInit::kFinal || init == AfInit::kGating) {
    value.zero_();
    return;
  }
  // Haiku's TruncatedNormal keeps draws within 2σ; 0.8796 is the standard deviation such a cut leaves.
  const double scale = init == AfInit::kRelu ? 2.0 : 1.0;
  const double sigma = std::sqrt(scale / static_cast<double>(value.size(0))) / 0.87962566103423978;
  torch::Tensor draw = torch::randn(value.sizes());
  for (torch::Tensor outside = draw.abs() > 2; outside.any().item<bool>(); outside = draw.abs() > 2)
    draw = torch::where(outside, torch::randn(value.sizes()), draw);
  value.copy_(draw * sigma);
}

torch::Tensor AfLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = torch::matmul(x, weights);
  // In place: the product is new, and neither it nor the sum is saved for backward.
  return bias.defined() ? y.add_(bias) : y;
}

AfLayerNormImpl::AfLayerNormImpl(int64_t channels, const torch::Device& device) {
  scale = register_parameter("scale", torch::ones({channels}, device));
  offset = register_parameter("offset", torch::zeros({channels}, device));
}

torch::Tensor AfLayerNormImpl::forward(const torch::Tensor& x) {
  return torch::layer_norm(x, {x.size(-1)}, scale, offset, 1e-5);
}

MsaAttentionImpl::MsaAttentionImpl(int64_t c_m, int64_t c_z, int64_t heads, bool column, const torch::Device& device)
    : per_column(column) {
  query_norm = register_module("query_norm", AfLayerNorm(c_m, device));
  if (!per_column) {
    feat_2d_norm = register_module("feat_2d_norm", AfLayerNorm(c_z, device));
    feat_2d_weights = register_parameter("feat_2d_weights", torch::zeros({c_z, heads}, device));
  }
  attention = make_attention(*this, c_m, heads, device);
}

torch::Tensor MsaAttentionImpl::forward(const torch::Tensor& m, const torch::Tensor& mask, const torch::Tensor& z, int64_t chunk,
                                       const dap::AxialLayout& layout) {
  // Row attention needs whole rows (the sequences are cut), column attention whole columns (the residues).
  const torch::Tensor local_mask = layout.mine(mask, per_column ? 1 : 0);    // [S', R] or [S, R']
  // Column attention attends over sequences: the same maths on the transposed MSA.
  const torch::Tensor rows = per_column ? m.transpose(0, 1) : m;                     // [B, K, c_m]
  const torch::Tensor row_mask = per_column ? local_mask.transpose(0, 1) : local_mask;  // [B, K]
  const torch::Tensor x = query_norm(rows);
  std::vector<torch::Tensor> biases = {key_mask_bias(row_mask)};
  if (!per_column) {
    // The pair bias [H, R, R]: each rank projects its rows of z, and every row is gathered.
    biases.push_back(layout.whole(torch::matmul(feat_2d_norm(z), feat_2d_weights), 0).permute({2, 0, 1}));
  }
  const torch::Tensor out = attention->forward(x, x, biases, chunk);
  return per_column ? out.transpose(0, 1) : out;
}

MsaColumnGlobalAttentionImpl::MsaColumnGlobalAttentionImpl(int64_t channels, int64_t h, const torch::Device& device) : heads(h) {
  KUAFU_CHECK(channels % heads == 0, "global attention channels (", channels, ") must divide by its heads (", heads, ")");
  const int64_t c = channels / heads;
  query_norm = register_module("query_norm", AfLayerNorm(channels, device));
  attention = register_module("attention", std::make_shared<torch::nn::Module>());
  query_w = attention->register_parameter("query_w", torch::zeros({channels, heads, c}, device));
  key_w = attention->register_parameter("key_w", torch::zeros({channels, c}, device));
  value_w = attention->register_parameter("value_w", torch::zeros({channels, c}, device));
  gating_w = attention->register_parameter("gating_w", torch::zeros({channels, heads, c}, device));
  gating_b = attention->register_parameter("gating_b", torch::zeros({heads, c}, device));
  output_w = attention->register_parameter("output_w", torch::zeros({heads, c, channels}, device));
  output_b = attention->register_parameter("output_b", torch::zeros({channels}, device));
}

torch::Tensor MsaColumnGlobalAttentionImpl::forward(const torch::Tensor& m, const torch::Tensor& mask,
                                                     const dap::AxialLayout& layout) {
  const torch::Tensor x = query_norm(m.transpose(0, 1));                             // [R', S, c]
  const torch::Tensor real = layout.mine(mask, 1).transpose(0, 1).unsqueeze(-1);     // [R', S, 1]
  const double head_width = static_cast<double>(key_w.size(1));
  // AlphaFold's masked mean: the sum over real sequences over their count (+1e-10).
  const torch::Tensor mean = (real * x).sum(1) / (real.sum(1) + 1e-10);  // [R, c]
  const torch::Tensor q = torch::einsum("ba,ahc->bhc", {mean, query_w}) / std::sqrt(head_width);   // [R, H, c']
  const torch::Tensor k = torch::matmul(x, key_w), v = torch::matmul(x, value_w);                  // [R, S, c']
  torch::Tensor logits = torch::einsum("bhc,bkc->bhk", {q, k}) + 1e9 * (real.squeeze(-1).unsqueeze(1) - 1.0);
  logits = logits.clamp(-1e8, 1e8);  // as the gated attention's: a column of padding passes no gradient
  const torch::Tensor average = torch::einsum("bhk,bkc->bhc", {torch::softmax(logits, -1), v});   // [R, H, c']
  const torch::Tensor gate = torch::sigmoid(torch::einsum("bqc,chv->bqhv", {x, gating_w}) + gating_b);  // [R, S, H, c']
  const torch::Tensor out = torch::einsum("bqhc,hco->bqo", {average.unsqueeze(1) * gate, output_w}) + output_b;
  return out.transpose(0, 1);  // [S, R', c]
}

TransitionImpl::TransitionImpl(int64_t channels, int64_t factor, const torch::Device& device) {
  input_layer_norm = register_module("input_layer_norm", AfLayerNorm(channels, device));
  transition1 = register_module("transition1", AfLinear(channels, factor * channels, device, AfInit::kRelu));
  transition2 = register_module("transition2", AfLinear(factor * channels, channels, device, AfInit::kFinal));
}

torch::Tensor TransitionImpl::forward(const torch::Tensor& x, int64_t chunk) {
  return nn::in_chunks(x.size(0), chunk, 0, [&](int64_t start, int64_t n) {
    return transition2(torch::relu(transition1(input_layer_norm(x.narrow(0, start, n)))));
  });
}

OuterProductMeanImpl::OuterProductMeanImpl(int64_t c_m, int64_t c_z, int64_t c_outer, const torch::Device& device) {
  layer_norm_input = register_module("layer_norm_input", AfLayerNorm(c_m, device));
  left_projection = register_module("left_projection", AfLinear(c_m, c_outer, device));
  right_projection = register_module("right_projection", AfLinear(c_m, c_outer, device));
  output_w = register_parameter("output_w", torch::zeros({c_outer, c_outer, c_z}, device));
  output_b = register_parameter("output_b", torch::zeros({c_z}, device));
}

torch::Tensor OuterProductMeanImpl::forward(const torch::Tensor& m, const torch::Tensor& mask, int64_t chunk,
                                            const dap::AxialLayout& layout) {
  const torch::Tensor local_mask = layout.mine(mask, 1);  // [S, R']: this rank's residues i
  const torch::Tensor real = local_mask.unsqueeze(-1);     // [S, R', 1]
  const torch::Tensor x = layer_norm_input(m);
  const torch::Tensor left = real * left_projection(x);                             // [S, R', c']
  const torch::Tensor right = layout.whole(real * right_projection(x), 1);          // [S, R, c']: every residue j
  // Rows i of the [R', R, c', c'] outer products a chunk at a time.
  const torch::Tensor summed = nn::in_chunks(left.size(1), chunk, 0, [&](int64_t start, int64_t n) {
    const torch::Tensor outer = torch::einsum("sic,sje->ijce", {left.narrow(1, start, n), right});  // [n, R, c', c']
    return torch::einsum("ijce,cef->ijf", {outer, output_w});                                       // [n, R, c_z]
  }) + output_b;  // [R', R, c_z]
  // AlphaFold divides the sum (its bias included) by the number of sequences where both are real.
  const torch::Tensor pairs = torch::einsum("si,sj->ij", {local_mask, mask}).unsqueeze(-1);
  return summed / (pairs + 1e-3);
}

TriangleMultiplicationImpl::TriangleMultiplicationImpl(int64_t c_z, int64_t c_hidden, bool out, const torch::Device& device)
    : outgoing(out) {
  layer_norm_input = register_module("layer_norm_input", AfLayerNorm(c_z, device));
  left_projection = register_module("left_projection", AfLinear(c_z, c_hidden, device));
  right_projection = register_module("right_projection", AfLinear(c_z, c_hidden, device));
  left_gate = register_module("left_gate", AfLinear(c_z, c_hidden, device, AfInit::kGating));
  right_gate = register_module("right_gate", AfLinear(c_z, c_hidden, device, AfInit::kGating));
  center_layer_norm = register_module("center_layer_norm", AfLayerNorm(c_hidden, device));
  output_projection = register_module("output_projection", AfLinear(c_hidden, c_z, device, AfInit::kFinal));
  gating_linear = register_module("gating_linear", AfLinear(c_z, c_z, device, AfInit::kGating));
}

torch::Tensor TriangleMultiplicationImpl::forward(const torch::Tensor& z, const torch::Tensor& mask, int64_t chunk,
                                                  const dap::AxialLayout& layout) {
  // Outgoing: u_ij = Σ_k a_ik b_jk (edges ik and jk). Incoming, u_ij = Σ_k a_kj b_ki, is the outgoing maths on
  // the transposed pair, transposed back (the gate is per edge): both run on rows of `pair`, the rows this
  // rank holds, against every row of b.
  const torch::Tensor pair = outgoing ? z : z.transpose(0, 1);                                  // [R', R, c_z]
  const torch::Tensor real = layout.mine(outgoing ? mask : mask.transpose(0, 1), 0).unsqueeze(-1);  // [R', R, 1]
  // Without gradients (inference) the gated projections are formed in place, one [n, R, c] buffer each
  // instead of three, and the normalised pair only a chunk of rows at a time.
  const bool inference = !torch::GradMode::is_enabled();
  const auto gated = [&](AfLinear& projection, AfLinear& gate, const torch::Tensor& xs, const torch::Tensor& rs) {
    if (!inference) return rs * projection(xs) * torch::sigmoid(gate(xs));
    return projection(xs).mul_(gate(xs).sigmoid_()).mul_(rs);
  };
  const torch::Tensor x = inference ? torch::Tensor() : layer_norm_input(pair);
  const auto normalised = [&](int64_t start, int64_t n) {
    return inference ? layer_norm_input(pair.narrow(0, start, n)) : x.narrow(0, start, n);
  };
  const torch::Tensor b = layout.whole(nn::in_chunks(pair.size(0), chunk, 0, [&](int64_t start, int64_t n) {
    return gated(right_projection, right_gate, normalised(start, n), real.narrow(0, start, n));
  }), 0);  // [R, R, c]
  // Rows i of the update a chunk at a time (only b is held whole).
  const torch::Tensor out = nn::in_chunks(pair.size(0), chunk, 0, [&](int64_t start, int64_t n) {
    const torch::Tensor xs = normalised(start, n), rs = real.narrow(0, start, n);
    const torch::Tensor a = gated(left_projection, left_gate, xs, rs);  // [n, R, c]
    const torch::Tensor update = torch::einsum("ikc,jkc->ijc", {a, b});  // [n, R, c]
    const torch::Tensor projected = output_projection(center_layer_norm(update)), gate = torch::sigmoid(gating_linear(xs));
    return inference ? projected.mul_(gate) : projected * gate;
  });
  return outgoing ? out : out.transpose(0, 1);
}

TriangleAttentionImpl::TriangleAttentionImpl(int64_t c_z, int64_t heads, bool ending, const torch::Device& device)
    : ending_node(ending) {
  query_norm = register_module("query_norm", AfLayerNorm(c_z, device));
  feat_2d_weights = register_parameter("feat_2d_weights", torch::zeros({c_z, heads}, device));
  attention = make_attention(*this, c_z, heads, device);
}

torch::Tensor TriangleAttentionImpl::forward(const torch::Tensor& z, const torch::Tensor& mask, int64_t chunk,
                                             const dap::AxialLayout& layout) {
  // The ending node's attention is the starting node's on the transposed pair; either attends along the
  // rows this rank holds, biased by every row.
  const torch::Tensor pair = ending_node ? z.transpose(0, 1) : z;                                // [R', R, c_z]
  const torch::Tensor pair_mask = layout.mine(ending_node ? mask.transpose(0, 1) : mask, 0);     // [R', R]
  const torch::Tensor x = query_norm(pair);
  const torch::Tensor triangle = layout.whole(torch::matmul(x, feat_2d_weights), 0).permute({2, 0, 1});  // [H, R, R]
  const torch::Tensor out = attention->forward(x, x, {key_mask_bias(pair_mask), triangle}, chunk);
  return ending_node ? out.transpose(0, 1) : out;
}

EvoformerBlockImpl::EvoformerBlockImpl(const EvoformerSizes& s, const torch::Device& device) {
  const int64_t c_m = s.msa_channels, c_z = s.pair_channels;
  msa_row_attention_with_pair_bias =
      register_module("msa_row_attention_with_pair_bias", MsaAttention(c_m, c_z, s.msa_heads, false, device));
  if (s.global_column_attention) {
    msa_column_global_attention = register_module("msa_column_global_attention", MsaColumnGlobalAttention(c_m, s.msa_heads, device));
  } else {
    msa_column_attention = register_module("msa_column_attention", MsaAttention(c_m, c_z, s.msa_heads, true, device));
  }
  msa_transition = register_module("msa_transition", Transition(c_m, s.transition_factor, device));
  outer_product_mean = register_module("outer_product_mean", OuterProductMean(c_m, c_z, s.outer_channels, device));
  triangle_multiplication_outgoing =
      register_module("triangle_multiplication_outgoing", TriangleMultiplication(c_z, s.triangle_channels, true, device));
  triangle_multiplication_incoming =
      register_module("triangle_multiplication_incoming", TriangleMultiplication(c_z, s.triangle_channels, false, device));
  triangle_attention_starting_node =
      register_module("triangle_attention_starting_node", TriangleAttention(c_z, s.pair_heads, false, device));
  triangle_attention_ending_node =
      register_module("triangle_attention_ending_node", TriangleAttention(c_z, s.pair_heads, true, device));
  pair_transition = register_module("pair_transition", Transition(c_z, s.transition_factor, device));
}

std::pair<torch::Tensor, torch::Tensor> EvoformerBlockImpl::forward(torch::Tensor m, torch::Tensor z, const torch::Tensor& msa_mask,
                                                                    const torch::Tensor& pair_mask, int64_t chunk,
                                                                    const dap::AxialLayout& layout) {
  // Each step runs on the axis it needs whole; `layout` moves the cut between steps (FastFold's DAP).
  m = m + msa_row_attention_with_pair_bias->forward(m, msa_mask, z, chunk, layout);
  m = layout.move(m, 0, 1);  // [S, R', c_m]: the residues cut from here to the outer product
  m = m + (msa_column_global_attention ? msa_column_global_attention->forward(m, msa_mask, layout)
                                       : msa_column_attention->forward(m, msa_mask, {}, chunk, layout));
  m = m + msa_transition->forward(m, chunk);
  // The next block's rows of m travel while the pair stack runs.
  dap::AxialLayout::Moving m_rows = layout.move_async(m, 1, 0);
  z = z + outer_product_mean->forward(m, msa_mask, chunk, layout);
  z = z + triangle_multiplication_outgoing->forward(z, pair_mask, chunk, layout);
  z = layout.move(z, 0, 1);  // [R, R', c_z]
  z = z + triangle_multiplication_incoming->forward(z, pair_mask, chunk, layout);
  z = layout.move(z, 1, 0);
  z = z + triangle_attention_starting_node->forward(z, pair_mask, chunk, layout);
  z = layout.move(z, 0, 1);
  z = z + triangle_attention_ending_node->forward(z, pair_mask, chunk, layout);
  z = z + pair_transition->forward(z, chunk);
  z = layout.move(z, 1, 0);
  return {m_rows.wait(), z};
}

int64_t dap_block_sent_elements(const EvoformerSizes& s, int64_t rows, int64_t residues, int64_t parts) {
  const int64_t n = parts, r = residues;
  // A gather sends this rank's block to each other rank; a move keeps 1/n of the block and sends the rest.
  const int64_t gathered = (r / n) * r * (s.msa_heads + 2 * s.triangle_channels + 2 * s.pair_heads) + rows * (r / n) * s.outer_channels;
  const int64_t moved = 2 * (rows / n) * r * s.msa_channels + 4 * (r / n) * r * s.pair_channels;
  return gathered * (n - 1) + moved / n * (n - 1);
}

void initialize_alphafold_weights(torch::nn::Module& root) {
  // The global column attention keeps its weights in a plain submodule: found by that module.
  std::map<const torch::nn::Module*, const MsaColumnGlobalAttentionImpl*> global_of;
  for (const auto& module : root.modules()) {
    const auto* global = dynamic_cast<const MsaColumnGlobalAttentionImpl*>(module.get());
    if (global) global_of[global->attention.get()] = global;
  }
  nn::initialize_by_module(root, [&](const torch::nn::Module& owner, const std::string& name, torch::Tensor& value) {
    torch::NoGradGuard no_grad;
    if (const auto* linear = dynamic_cast<const AfLinearImpl*>(&owner)) {
      linear->initial_value(name, value);
    } else if (dynamic_cast<const AfLayerNormImpl*>(&owner)) {
      value.fill_(name == "scale" ? 1.0 : 0.0);
    } else if (const auto* attention = dynamic_cast<const nn::GatedAttentionImpl*>(&owner)) {
      attention->initial_value(name, value);
    } else if (const auto found = global_of.find(&owner); found != global_of.end()) {
      const int64_t channels = found->second->query_w.size(0), width = found->second->key_w.size(1);
      if (name == "query_w") {
        nn::glorot_uniform(value, channels, found->second->heads * width);
      } else if (name == "key_w" || name == "value_w") {
        nn::glorot_uniform(value, channels, width);
      } else {
        value.fill_(name == "gating_b" ? 1.0 : 0.0);  // the gate open, the output closed
      }
    } else if (name == "feat_2d_weights") {
      // The pair-bias projections (row attention, triangle attention): normal, σ = 1/√c_z.
      value.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(value.size(0))));
    } else if (name == "trainable_point_weights") {
      value.fill_(std::log(std::exp(1.0) - 1.0));  // IPA's point weights start at softplus⁻¹(1)
    } else {
      value.zero_();  // the outer product mean's output (a final layer)
    }
    return true;
  });
}

std::string alphafold_key(const std::string& module_path, const std::string& parameter) {
  const size_t last = parameter.rfind('.');
  std::string scope = last == std::string::npos ? "" : "/" + parameter.substr(0, last);
  for (char& c : scope) c = c == '.' ? '/' : c;
  return module_path + scope + "//" + parameter.substr(last == std::string::npos ? 0 : last + 1);
}

void load_alphafold_parameters(torch::nn::Module& module, const io::NpzArrays& params, const std::string& prefix, int64_t block) {
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    const std::string& name = item.key();
    const std::string key = alphafold_key(prefix, name);
    const auto found = params.find(key);
    KUAFU_CHECK(found != params.end(), "AlphaFold parameters: no array '", key, "' for ", name);
    const torch::Tensor value = block >= 0 ? found->second[block] : found->second;
    KUAFU_CHECK(value.sizes() == item.value().sizes(), "AlphaFold parameters: '", key, "' is ", value.sizes(), ", the model's ",
                name, " is ", item.value().sizes());
    item.value().copy_(value);
  }
}

}  // namespace kuafu::fold
