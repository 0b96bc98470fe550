#include "apps/fastfold/rigid.h"

#include <cmath>

#include <torch/torch.h>

namespace kuafu::fold {
namespace {

torch::Tensor rotate(const torch::Tensor& rotation, const torch::Tensor& points) {
  return torch::einsum("...ij,...j->...i", {rotation, points});
}

torch::Tensor normalized(const torch::Tensor& v) { return v / torch::linalg_vector_norm(v, 2, {-1}, /*keepdim=*/true); }

// v / max(|v|, 1e-8) (AlphaFold's vecs_robust_normalize).
torch::Tensor robustly_normalized(const torch::Tensor& v) {
  return v / torch::sqrt(torch::clamp_min(v.square().sum(-1, true), 1e-16));
}

}  // namespace

Rigid Rigid::identity(torch::IntArrayRef batch, const torch::TensorOptions& options) {
  std::vector<int64_t> rotation_shape(batch.begin(), batch.end());
  rotation_shape.insert(rotation_shape.end(), {3, 3});
  std::vector<int64_t> translation_shape(batch.begin(), batch.end());
  translation_shape.push_back(3);
  return {torch::eye(3, options).expand(rotation_shape).clone(), torch::zeros(translation_shape, options)};
}

Rigid Rigid::compose(const Rigid& inner) const {
  return {torch::matmul(rotation, inner.rotation), rotate(rotation, inner.translation) + translation};
}

Rigid Rigid::inverse() const {
  const torch::Tensor transposed = rotation.transpose(-1, -2);
  return {transposed, -rotate(transposed, translation)};
}

torch::Tensor Rigid::apply(const torch::Tensor& points) const { return rotate(rotation, points) + translation; }

torch::Tensor Rigid::invert_apply(const torch::Tensor& points) const {
  return rotate(rotation.transpose(-1, -2), points - translation);
}

Rigid Rigid::unsqueeze(int64_t dim) const { return {rotation.unsqueeze(dim), translation.unsqueeze(dim)}; }

Rigid Rigid::index(int64_t dim, const torch::Tensor& indices) const {
  return {rotation.index_select(dim, indices), translation.index_select(dim, indices)};
}

Rigid Rigid::detach_rotation() const { return {rotation.detach(), translation}; }

Rigid Rigid::to(const torch::TensorOptions& options) const {
  return {rotation.to(options.device(), options.dtype()), translation.to(options.device(), options.dtype())};
}

Rigid rigid_from_3_points(const torch::Tensor& n, const torch::Tensor& ca, const torch::Tensor& c) {
  const torch::Tensor e1 = normalized(c - ca);                                        // [*, 3]
  const torch::Tensor towards_n = n - ca;                                             // [*, 3]
  const torch::Tensor e2 = normalized(towards_n - e1 * (e1 * towards_n).sum(-1, true));  // Gram-Schmidt
  const torch::Tensor e3 = torch::linalg_cross(e1, e2, -1);
  return {torch::stack({e1, e2, e3}, -1), ca};  // the axes as columns: [*, 3, 3]
}

Rigid rigid_from_points(const torch::Tensor& x_from, const torch::Tensor& origin, const torch::Tensor& in_xy_plane) {
  const torch::Tensor e0 = robustly_normalized(origin - x_from);                                // [*, 3]
  const torch::Tensor towards = in_xy_plane - origin;
  const torch::Tensor e1 = robustly_normalized(towards - e0 * (towards * e0).sum(-1, true));  // Gram-Schmidt
  const torch::Tensor e2 = torch::linalg_cross(e0, e1, -1);
  return {torch::stack({e0, e1, e2}, -1), origin};  // the axes as columns: [*, 3, 3]
}

torch::Tensor quaternion_to_rotation(const torch::Tensor& quaternion) {
  const torch::Tensor q = normalized(quaternion);
  const torch::Tensor w = q.select(-1, 0), x = q.select(-1, 1), y = q.select(-1, 2), z = q.select(-1, 3);
  const std::vector<torch::Tensor> rows = {
      torch::stack({w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y)}, -1),
      torch::stack({2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x)}, -1),
      torch::stack({2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z}, -1)};
  return torch::stack(rows, -2);  // [*, 3, 3]
}

Rigid rigid_from_update(const torch::Tensor& update) {
  const torch::Tensor bcd = update.narrow(-1, 0, 3);
  const torch::Tensor quaternion = torch::cat({torch::ones_like(bcd.narrow(-1, 0, 1)), bcd}, -1);  // (1, b, c, d)
  return {quaternion_to_rotation(quaternion), update.narrow(-1, 3, 3)};
}

torch::Tensor virtual_beta(const torch::Tensor& n, const torch::Tensor& ca, const torch::Tensor& c) {
  // Engh & Huber's ideal geometry: CA-CB 1.530 Å, N-CA-CB 110.5°, C-CA-CB 110.1°. The direction v of CB
  // is a u + b w + g (u × w)/|u × w| with u, w the unit vectors to N and to C; the two angles fix a and
  // b, |v| = 1 fixes g up to its sign, and an L-amino acid's CB lies on the side of u × w.
  constexpr double kDegree = M_PI / 180.0;
  const double cos_n = std::cos(110.5 * kDegree), cos_c = std::cos(110.1 * kDegree);
  const torch::Tensor u = normalized(n - ca), w = normalized(c - ca);  // [*, 3]
  const torch::Tensor g = (u * w).sum(-1, true);                         // cos(N-CA-C), [*, 1]
  const torch::Tensor a = (cos_n - g * cos_c) / (1 - g * g);
  const torch::Tensor b = (cos_c - g * cos_n) / (1 - g * g);
  const torch::Tensor in_plane = a * u + b * w;
  const torch::Tensor out = (1 - (in_plane * in_plane).sum(-1, true)).clamp_min(0).sqrt();
  const torch::Tensor normal = normalized(torch::linalg_cross(u, w, -1));
  return ca + 1.530 * (in_plane + out * normal);
}

}  // namespace kuafu::fold
