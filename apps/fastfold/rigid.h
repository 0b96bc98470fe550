// Rigid frames as AlphaFold 2 uses them (supplement 1.8): each residue's backbone gives a rotation R and
// a translation t, and a frame maps a point x in its local coordinates to R x + t in global ones.
// Every function works on any batch of frames ([*, 3, 3] and [*, 3]) and any floating dtype.
#pragma once

#include <torch/types.h>

namespace kuafu::fold {

struct Rigid {
  torch::Tensor rotation;     // [*, 3, 3]
  torch::Tensor translation;  // [*, 3]

  // The frames that change nothing, for `batch` ([*]) frames.
  static Rigid identity(torch::IntArrayRef batch, const torch::TensorOptions& options);

  Rigid compose(const Rigid& inner) const;  // this ∘ inner: x -> R (R' x + t') + t
  Rigid inverse() const;                    // x -> Rᵀ (x − t)
  torch::Tensor apply(const torch::Tensor& points) const;         // [*, 3] local -> global
  torch::Tensor invert_apply(const torch::Tensor& points) const;  // [*, 3] global -> local
  // Each frame with a new axis at `dim` of its batch (0 ≤ dim ≤ batch dims), to broadcast against
  // other residues' points: frames [N] and points [N, M, 3] become frames [N, 1] over [N, M].
  Rigid unsqueeze(int64_t dim) const;
  Rigid index(int64_t dim, const torch::Tensor& indices) const;  // frames picked along batch dim `dim`
  Rigid detach_rotation() const;
  Rigid to(const torch::TensorOptions& options) const;  // dtype and device  // the rotation's gradient stopped (between structure-module layers)
};

// A residue's backbone frame from its N, CA and C atoms ([*, 3] each; supplement Algorithm 21,
// Gram-Schmidt): origin at CA, the x axis towards C, N in the xy plane with a positive y.
Rigid rigid_from_3_points(const torch::Tensor& n, const torch::Tensor& ca, const torch::Tensor& c);

// The frame with its origin at `origin`, its x axis along x_from -> origin and `in_xy_plane` in its xy plane
// (y > 0), [*, 3] each: AlphaFold's rigids_from_3_points, which builds the truth's frames and torsions.
// Degenerate input (missing atoms at 0) gives a zero rotation, not NaN: lengths are held at 1e-8 or more.
Rigid rigid_from_points(const torch::Tensor& x_from, const torch::Tensor& origin, const torch::Tensor& in_xy_plane);

// The rotation of quaternions [*, 4] (w, x, y, z), normalised first.
torch::Tensor quaternion_to_rotation(const torch::Tensor& quaternion);

// Algorithm 23's update of a frame from the structure module's six numbers [*, 6]: (b, c, d) make the
// quaternion (1, b, c, d), the last three the translation.
Rigid rigid_from_update(const torch::Tensor& update);

// The virtual CB of a residue from its N, CA and C ([*, 3] each): the ideal tetrahedral position at
// 1.52 Å from CA, for residues whose CB is missing (glycine has none; pseudo-beta is CA there).
torch::Tensor virtual_beta(const torch::Tensor& n, const torch::Tensor& ca, const torch::Tensor& c);

}  // namespace kuafu::fold
