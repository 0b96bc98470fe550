#include "apps/fastfold/structure_module.h"

#include <cmath>

#include <torch/torch.h>

namespace kuafu::fold {
namespace {

// A projection to H × n points [R, H·3·n], AlphaFold's layout (all x, then all y, then all z), as
// points [R, H, n, 3] placed in the global frame by each residue's frame.
torch::Tensor global_points(const torch::Tensor& projected, int64_t heads, int64_t n, const Rigid& frames) {
  const std::vector<torch::Tensor> xyz = projected.chunk(3, -1);                    // 3 × [R, H·n]
  const torch::Tensor local = torch::stack(xyz, -1).unflatten(1, {heads, n});       // [R, H, n, 3]
  return frames.unsqueeze(1).unsqueeze(1).apply(local);
}

}  // namespace

InvariantPointAttentionImpl::InvariantPointAttentionImpl(const IpaSizes& s) : sizes(s) {
  const int64_t c = s.single_channels, h = s.heads;
  q_scalar = register_module("q_scalar", AfLinear(c, h * s.scalar_qk));
  kv_scalar = register_module("kv_scalar", AfLinear(c, h * (s.scalar_qk + s.scalar_v)));
  q_point_local = register_module("q_point_local", AfLinear(c, h * 3 * s.point_qk));
  kv_point_local = register_module("kv_point_local", AfLinear(c, h * 3 * (s.point_qk + s.point_v)));
  // softplus(log(e - 1)) = 1: the point term starts at its nominal weight.
  trainable_point_weights = register_parameter("trainable_point_weights", torch::full({h}, std::log(std::exp(1.0) - 1.0)));
  attention_2d = register_module("attention_2d", AfLinear(s.pair_channels, h));
  const int64_t concatenated = h * (s.scalar_v + 4 * s.point_v + s.pair_channels);
  output_projection = register_module("output_projection", AfLinear(concatenated, c));
}

torch::Tensor InvariantPointAttentionImpl::forward(const torch::Tensor& s, const torch::Tensor& z, const Rigid& frames,
                                                   const torch::Tensor& mask) {
  const int64_t residues = s.size(0), h = sizes.heads;
  const torch::Tensor q = q_scalar(s).view({residues, h, sizes.scalar_qk});                         // [R, H, c]
  const std::vector<torch::Tensor> kv = kv_scalar(s).view({residues, h, -1}).split({sizes.scalar_qk, sizes.scalar_v}, -1);
  const torch::Tensor q_points = global_points(q_point_local(s), h, sizes.point_qk, frames);         // [R, H, p, 3]
  const std::vector<torch::Tensor> kv_points =
      global_points(kv_point_local(s), h, sizes.point_qk + sizes.point_v, frames).split({sizes.point_qk, sizes.point_v}, 2);
  // Each of the three terms weighted so that it has unit variance at initialisation (supplement 1.8.2).
  const double scalar_weight = std::sqrt(1.0 / (3.0 * static_cast<double>(sizes.scalar_qk)));
  const torch::Tensor point_weight = std::sqrt(1.0 / (3.0 * static_cast<double>(sizes.point_qk) * 9.0 / 2.0)) *
                                     torch::softplus(trainable_point_weights);                          // [H]
  const torch::Tensor scalar_logits = torch::einsum("ihc,jhc->hij", {q * scalar_weight, kv[0]});       // [H, R, R]
  const torch::Tensor distance2 =
      (q_points.unsqueeze(1) - kv_points[0].unsqueeze(0)).square().sum({-1, -2}).permute({2, 0, 1});    // [H, R, R]
  const torch::Tensor point_logits = -0.5 * point_weight.view({h, 1, 1}) * distance2;
  const torch::Tensor pair_logits = std::sqrt(1.0 / 3.0) * attention_2d(z).permute({2, 0, 1});       // [H, R, R]
  const torch::Tensor real = mask.unsqueeze(-1) * mask.unsqueeze(0);                                  // [R, R]
  const torch::Tensor weights = torch::softmax(scalar_logits + point_logits + pair_logits - 1e5 * (1.0 - real), -1);
  const torch::Tensor scalar_out = torch::einsum("hij,jhc->ihc", {weights, kv[1]}).reshape({residues, -1});  // [R, H·c]
  const torch::Tensor points_global = torch::einsum("hij,jhpx->ihpx", {weights, kv_points[1]});              // [R, H, p, 3]
  const torch::Tensor points_local = frames.unsqueeze(1).unsqueeze(1).invert_apply(points_global);          // [R, H, p, 3]
  const torch::Tensor xyz = points_local.reshape({residues, h * sizes.point_v, 3});
  const torch::Tensor norms = torch::sqrt(1e-8 + xyz.square().sum(-1));                                     // [R, H·p]
  const torch::Tensor pair_out = torch::einsum("hij,ijc->ihc", {weights, z}).reshape({residues, -1});         // [R, H·c_z]
  return output_projection(
      torch::cat({scalar_out, xyz.select(-1, 0), xyz.select(-1, 1), xyz.select(-1, 2), norms, pair_out}, -1));
}

}  // namespace kuafu::fold
