#include "apps/fastfold/structure_module.h"

#include <cmath>

#include <torch/torch.h>

#include "core/nn/chunks.h"

namespace kuafu::fold {
namespace {

// A projection to H × n points [R, H·3·n], AlphaFold's layout (all x, then all y, then all z), as
// points [R, H, n, 3] placed in the global frame by each residue's frame.
torch::Tensor global_points(const torch::Tensor& projected, int64_t heads, int64_t n, const Rigid& frames) {
  const std::vector<torch::Tensor> xyz = projected.chunk(3, -1);                    // 3 × [R, H·n]
  const torch::Tensor local = torch::stack(xyz, -1).unflatten(1, {heads, n});       // [R, H, n, 3]
  return frames.unsqueeze(1).unsqueeze(1).apply(local);
}

// Haiku's name for the n-th use of a module named `name` in one scope: name, name_1, name_2, ...
std::string haiku_name(const std::string& name, size_t n) { return n == 0 ? name : name + "_" + std::to_string(n); }

// The Hamilton product q ⊗ (0, v) of quaternions [*, 4] (w, x, y, z) and vectors [*, 3].
torch::Tensor quaternion_times_vector(const torch::Tensor& q, const torch::Tensor& v) {
  const torch::Tensor w = q.select(-1, 0), x = q.select(-1, 1), y = q.select(-1, 2), z = q.select(-1, 3);
  const torch::Tensor a = v.select(-1, 0), b = v.select(-1, 1), c = v.select(-1, 2);
  return torch::stack({-x * a - y * b - z * c, w * a + y * c - z * b, w * b - x * c + z * a, w * c + x * b - y * a}, -1);
}

torch::Tensor unit_quaternion(const torch::Tensor& q) { return q / torch::linalg_vector_norm(q, 2, {-1}, true); }

}  // namespace

InvariantPointAttentionImpl::InvariantPointAttentionImpl(const IpaSizes& s, const torch::Device& device) : sizes(s) {
  const int64_t c = s.single_channels, h = s.heads;
  q_scalar = register_module("q_scalar", AfLinear(c, h * s.scalar_qk, device));
  kv_scalar = register_module("kv_scalar", AfLinear(c, h * (s.scalar_qk + s.scalar_v), device));
  q_point_local = register_module("q_point_local", AfLinear(c, h * 3 * s.point_qk, device));
  kv_point_local = register_module("kv_point_local", AfLinear(c, h * 3 * (s.point_qk + s.point_v), device));
  // softplus(log(e - 1)) = 1: the point term starts at its nominal weight.
  trainable_point_weights = register_parameter("trainable_point_weights", torch::zeros({h}, device));
  attention_2d = register_module("attention_2d", AfLinear(s.pair_channels, h, device));
  const int64_t concatenated = h * (s.scalar_v + 4 * s.point_v + s.pair_channels);
  output_projection = register_module("output_projection", AfLinear(concatenated, c, device, AfInit::kFinal));
}

torch::Tensor InvariantPointAttentionImpl::forward(const torch::Tensor& s, const torch::Tensor& z, const Rigid& frames,
                                                   const torch::Tensor& mask, int64_t chunk_size) {
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
  // Each query residue attends on its own, so the queries go in chunks of rows (inference: the point
  // distances [n, R, H, p, 3] of a chunk are alive at a time, not of all R²).
  const auto attend = [&](int64_t start, int64_t n) {
    const torch::Tensor scalar_logits =
        torch::einsum("ihc,jhc->hij", {q.narrow(0, start, n) * scalar_weight, kv[0]});               // [H, n, R]
    const torch::Tensor distance2 = (q_points.narrow(0, start, n).unsqueeze(1) - kv_points[0].unsqueeze(0))
                                        .square().sum({-1, -2}).permute({2, 0, 1});                   // [H, n, R]
    const torch::Tensor point_logits = -0.5 * point_weight.view({h, 1, 1}) * distance2;
    const torch::Tensor z_rows = z.narrow(0, start, n);                                               // [n, R, c_z]
    const torch::Tensor pair_logits = std::sqrt(1.0 / 3.0) * attention_2d(z_rows).permute({2, 0, 1});  // [H, n, R]
    const torch::Tensor real = mask.narrow(0, start, n).unsqueeze(-1) * mask.unsqueeze(0);          // [n, R]
    const torch::Tensor weights = torch::softmax(scalar_logits + point_logits + pair_logits - 1e5 * (1.0 - real), -1);
    const torch::Tensor scalar_out = torch::einsum("hij,jhc->ihc", {weights, kv[1]}).reshape({n, -1});  // [n, H·c]
    const torch::Tensor points_global = torch::einsum("hij,jhpx->ihpx", {weights, kv_points[1]});       // [n, H, p, 3]
    const Rigid query_frames{frames.rotation.narrow(0, start, n), frames.translation.narrow(0, start, n)};
    const torch::Tensor points_local = query_frames.unsqueeze(1).unsqueeze(1).invert_apply(points_global);  // [n, H, p, 3]
    const torch::Tensor xyz = points_local.reshape({n, h * sizes.point_v, 3});
    const torch::Tensor norms = torch::sqrt(1e-8 + xyz.square().sum(-1));                              // [n, H·p]
    const torch::Tensor pair_out = torch::einsum("hij,ijc->ihc", {weights, z_rows}).reshape({n, -1});  // [n, H·c_z]
    return torch::cat({scalar_out, xyz.select(-1, 0), xyz.select(-1, 1), xyz.select(-1, 2), norms, pair_out}, -1);
  };
  return output_projection(nn::in_chunks(residues, chunk_size, 0, attend));
}

AngleResnetImpl::AngleResnetImpl(int64_t channels, int64_t initial_channels, int64_t hidden, int64_t count,
                                 const torch::Device& device) {
  input_projection = register_module("input_projection", AfLinear(channels, hidden, device));
  input_projection_1 = register_module("input_projection_1", AfLinear(initial_channels, hidden, device));
  for (int64_t b = 0; b < count; ++b) {
    blocks.emplace_back(register_module(haiku_name("resblock1", b), AfLinear(hidden, hidden, device, AfInit::kRelu)),
                        register_module(haiku_name("resblock2", b), AfLinear(hidden, hidden, device, AfInit::kFinal)));
  }
  unnormalized_angles = register_module("unnormalized_angles", AfLinear(hidden, 2 * kTorsions, device));
}

torch::Tensor AngleResnetImpl::forward(const torch::Tensor& s, const torch::Tensor& s_initial) {
  torch::Tensor a = input_projection(torch::relu(s)) + input_projection_1(torch::relu(s_initial));  // [R, hidden]
  for (auto& [first, second] : blocks) a = a + second(torch::relu(first(torch::relu(a))));
  return unnormalized_angles(torch::relu(a)).unflatten(-1, {kTorsions, 2});  // [R, 7, 2]
}

FoldIterationImpl::FoldIterationImpl(const StructureModuleSizes& s, const torch::Device& device) {
  const int64_t c = s.ipa.single_channels;
  invariant_point_attention = register_module("invariant_point_attention", InvariantPointAttention(s.ipa, device));
  attention_layer_norm = register_module("attention_layer_norm", AfLayerNorm(c, device));
  for (int64_t i = 0; i < s.transition_layers; ++i)
    transition.push_back(register_module(haiku_name("transition", static_cast<size_t>(i)),
                                         AfLinear(c, c, device, i + 1 < s.transition_layers ? AfInit::kRelu : AfInit::kFinal)));
  transition_layer_norm = register_module("transition_layer_norm", AfLayerNorm(c, device));
  affine_update = register_module("affine_update", AfLinear(c, 6, device, AfInit::kFinal));
  rigid_sidechain = register_module("rigid_sidechain", AngleResnet(c, s.single_channels, s.angle_channels, s.angle_blocks, device));
}

Rigid StructureOutputs::backbone(int64_t layer) const {
  return {quaternion_to_rotation(quaternions.select(0, layer)), translations.select(0, layer)};
}

StructureModuleImpl::StructureModuleImpl(const StructureModuleSizes& s, const torch::Device& device) : sizes(s) {
  single_layer_norm = register_module("single_layer_norm", AfLayerNorm(s.single_channels, device));
  initial_projection = register_module("initial_projection", AfLinear(s.single_channels, s.ipa.single_channels, device));
  pair_layer_norm = register_module("pair_layer_norm", AfLayerNorm(s.ipa.pair_channels, device));
  fold_iteration = register_module("fold_iteration", FoldIteration(s, device));
}

StructureOutputs StructureModuleImpl::forward(const torch::Tensor& single, const torch::Tensor& pair,
                                              const torch::Tensor& aatype, const torch::Tensor& mask,
                                              const ResidueGeometry& geometry, int64_t chunk_size) {
  const int64_t residues = single.size(0);
  FoldIterationImpl& fold = *fold_iteration;
  const torch::Tensor initial = single_layer_norm(single);  // [R, c_s]
  torch::Tensor s = initial_projection(initial);            // [R, c]
  // The pair normalised in the module's dtype, a chunk of rows at a time: a pair of another dtype (a bf16
  // trunk's) has no whole copy made in this one besides the result.
  const torch::ScalarType dtype = single.scalar_type();
  const torch::Tensor z = nn::in_chunks(residues, chunk_size, 0, [&](int64_t start, int64_t n) {
    return pair_layer_norm(pair.narrow(0, start, n).to(dtype));
  });  // [R, R, c_z]
  // Every frame starts at the origin, unrotated (the "black hole" initialisation).
  torch::Tensor quaternion = torch::zeros({residues, 4}, single.options());  // (1, 0, 0, 0): no rotation
  quaternion.select(1, 0).fill_(1.0);
  torch::Tensor translation = torch::zeros({residues, 3}, single.options());  // units of position_scale
  std::vector<torch::Tensor> quaternions, translations, raw_angles, angles, rotations, origins, atoms;
  for (int64_t layer = 0; layer < sizes.layers; ++layer) {
    quaternion = unit_quaternion(quaternion);
    const torch::Tensor rotation = quaternion_to_rotation(quaternion);  // [R, 3, 3]
    s = fold.attention_layer_norm(s + fold.invariant_point_attention->forward(s, z, Rigid{rotation, translation}, mask, chunk_size));
    torch::Tensor t = s;
    for (size_t i = 0; i < fold.transition.size(); ++i) {
      t = fold.transition[i](t);
      if (i + 1 < fold.transition.size()) t = torch::relu(t);
    }
    s = fold.transition_layer_norm(s + t);
    // Algorithm 23: the update composed on the right, as a quaternion step renormalised.
    const torch::Tensor update = fold.affine_update(s);  // [R, 6]
    const torch::Tensor new_quaternion = unit_quaternion(quaternion + quaternion_times_vector(quaternion, update.narrow(-1, 0, 3)));
    const torch::Tensor new_translation = translation + torch::einsum("rij,rj->ri", {rotation, update.narrow(-1, 3, 3)});
    const torch::Tensor unnormalized = fold.rigid_sidechain(s, initial);  // [R, 7, 2]
    const torch::Tensor normalized =
        unnormalized / torch::sqrt(torch::clamp_min(unnormalized.square().sum(-1, true), 1e-12));
    const Rigid backbone{quaternion_to_rotation(new_quaternion), new_translation * sizes.position_scale};
    const Rigid frames = torsions_to_frames(geometry, aatype, backbone, normalized);  // [R, 8]
    quaternions.push_back(new_quaternion);
    translations.push_back(backbone.translation);
    raw_angles.push_back(unnormalized);
    angles.push_back(normalized);
    rotations.push_back(frames.rotation);
    origins.push_back(frames.translation);
    atoms.push_back(frames_to_atom14(geometry, aatype, frames));
    // The next layer sees the rotation without its gradient (supplement 1.8.2: stable training).
    quaternion = new_quaternion.detach();
    translation = new_translation;
  }
  return {s,
          torch::stack(quaternions),
          torch::stack(translations),
          torch::stack(raw_angles),
          torch::stack(angles),
          {torch::stack(rotations), torch::stack(origins)},
          torch::stack(atoms)};
}

}  // namespace kuafu::fold
