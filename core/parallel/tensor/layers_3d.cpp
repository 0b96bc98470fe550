#include "core/parallel/tensor/layers_3d.h"

#include <torch/csrc/autograd/custom_function.h>

#include "core/dist/autograd_collectives.h"
#include "core/dist/collectives.h"
#include "core/parallel/tensor/summa.h"
#include "core/parallel/tensor/vocab_parallel.h"
#include "core/util/error.h"

namespace kuafu::parallel {
namespace {

using summa::rows_of;
using summa::save_group;
using summa::saved_group;

constexpr const char* kX = "tp_x";
constexpr const char* kY = "tp_y";
constexpr const char* kZ = "tp_z";  // I: always splits the batch, and the weight blocks' input features

const char* feature_axis(Side3d side) { return side == Side3d::kY ? kY : kX; }  // F
const char* batch_axis(Side3d side) { return side == Side3d::kY ? kX : kY; }    // G

void check_divisible(int64_t size, int64_t divisor, const char* what, int64_t q) {
  KUAFU_CHECK(size % divisor == 0, "3D tensor parallelism: ", what, " ", size, " is not divisible by ", divisor,
              " (cube side q = ", q, ", ", q * q * q, " ranks as ", q, " x ", q, " x ", q, ")");
}

void check_block(const torch::Tensor& x, int64_t features, const char* layer) {
  KUAFU_CHECK(x.dim() >= 2 && x.size(-1) == features, layer, " expects an activation block [B/q^2, ..., ", features,
              "] (batch rows over the side's batch axis and tp_z, features over its feature axis), got ", x.sizes());
}

// Y block = reduce_scatter_K(all_gather_J(X block) all_gather_I(A block)) with the backward written out
// (layers_3d.h). `a` is the [in/q^2, out/q] view of the weight whatever its storage order; autograd
// carries dA through the view.
struct Matmul3d : torch::autograd::Function<Matmul3d> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& a,
                               dist::GroupPtr i_group, dist::GroupPtr j_group, dist::GroupPtr k_group) {
    const torch::Tensor x_ik = dist::all_gather(x.contiguous(), *j_group, /*dim=*/0);  // X_{i,k} [B/q, ..., in/q]
    const torch::Tensor a_kj = dist::all_gather(a.contiguous(), *i_group, /*dim=*/0);  // A_{k,j} [in/q, out/q]
    const torch::Tensor p = torch::matmul(x_ik, a_kj);                                 // [B/q, ..., out/q]
    torch::Tensor y = dist::reduce_scatter(p, *k_group, /*dim=*/0);                     // [B/q^2, ..., out/q]
    ctx->save_for_backward({x, a});
    save_group(ctx, "i", std::move(i_group));
    save_group(ctx, "j", std::move(j_group));
    save_group(ctx, "k", std::move(k_group));
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];  // X block [B/q^2, ..., in/q]
    const torch::Tensor& a = saved[1];  // A block [in/q^2, out/q]
    const dist::GroupPtr i_group = saved_group(ctx, "i"), j_group = saved_group(ctx, "j"),
                         k_group = saved_group(ctx, "k");
    // dY_{i,j} [B/q, ..., out/q]: the gradient of every row of P, summed over nothing (P's rows fed
    // exactly one Y block each, on the rank of the K line that kept them).
    const torch::Tensor dy = dist::all_gather(grads[0].contiguous(), *k_group, /*dim=*/0);
    // Every rank of a line agrees on which inputs need a gradient: they run the same model.
    torch::Tensor dx, da;
    if (ctx->needs_input_grad(0)) {
      // dX block = part j of Σ_j dY_{i,j} A_{k,j}^T, summed along the J line.
      const torch::Tensor a_kj = dist::all_gather(a.contiguous(), *i_group, /*dim=*/0);
      dx = dist::reduce_scatter(torch::matmul(dy, a_kj.t()).contiguous(), *j_group, /*dim=*/0);
    }
    if (ctx->needs_input_grad(1)) {
      // dA block = input part i of Σ_i X_{i,k}^T dY_{i,j}, summed along the I line.
      const torch::Tensor x_ik = dist::all_gather(x.contiguous(), *j_group, /*dim=*/0);
      da = dist::reduce_scatter(torch::matmul(rows_of(x_ik).t(), rows_of(dy)).contiguous(), *i_group, /*dim=*/0);
    }
    return {dx, da, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

Side3d other_side(Side3d side) { return side == Side3d::kY ? Side3d::kX : Side3d::kY; }

int cube_side_3d(const dist::ProcessMesh& mesh) {
  int x = -1, y = -1, z = -1, index = 0;
  for (const auto& axis : mesh.axes()) {
    if (axis.name == kX) x = index;
    if (axis.name == kY) y = index;
    if (axis.name == kZ) z = index;
    ++index;
  }
  KUAFU_CHECK(x >= 0 && y >= 0 && z >= 0, "3D tensor parallelism needs mesh axes 'tp_x', 'tp_y' and 'tp_z', but the "
              "mesh is ", mesh.describe());
  // The layouts number blocks in mesh order, and the collectives assume tp_z is the innermost of the three.
  KUAFU_CHECK(x < y && y < z, "3D tensor parallelism needs the mesh axes in the order tp_x, tp_y, tp_z, but the mesh is ",
              mesh.describe());
  KUAFU_CHECK(mesh.size(kX) == mesh.size(kY) && mesh.size(kY) == mesh.size(kZ),
              "3D tensor parallelism needs a cube, but tp_x = ", mesh.size(kX), ", tp_y = ", mesh.size(kY),
              " and tp_z = ", mesh.size(kZ));
  return mesh.size(kX);
}

Layout activation_layout_3d(int64_t dims, Side3d side) {
  KUAFU_CHECK(dims >= 2, "a 3D activation needs a batch and a feature dimension, got ", dims, " dimension(s)");
  return {{0, {batch_axis(side), kZ}, 1}, {dims - 1, {feature_axis(side)}, 1}};
}

torch::Tensor split_activation_3d(const torch::Tensor& full, const dist::ProcessMesh& mesh, Side3d side) {
  cube_side_3d(mesh);
  return shard_of(full, activation_layout_3d(full.dim(), side), mesh);
}

torch::Tensor gather_activation_3d(const torch::Tensor& block, const dist::ProcessMesh& mesh, Side3d side) {
  cube_side_3d(mesh);
  return gather_full(block, activation_layout_3d(block.dim(), side), mesh);
}

// ---- Linear3d ----

Linear3dImpl::Linear3dImpl(const LinearSpec& spec, const dist::ProcessMesh& mesh, Side3d input_side)
    : spec_(spec), input_side_(input_side) {
  const int64_t q = cube_side_3d(mesh);
  KUAFU_CHECK(spec.stride >= 1 && spec.out % spec.stride == 0, "Linear3d: output features ", spec.out,
              " do not split into stride ", spec.stride, " segments");
  check_divisible(spec.in, q * q, "Linear3d input features", q);
  check_divisible(spec.out / spec.stride, q,
                  spec.stride > 1 ? "Linear3d output features per stride segment" : "Linear3d output features", q);
  const int64_t in = spec.in / (q * q), out = spec.out / q;
  weight = register_parameter("weight", spec.order == WeightOrder::kInOut ? torch::zeros({in, out}, parameter_options(mesh))
                                                                          : torch::zeros({out, in}, parameter_options(mesh)));
  if (spec.bias) bias = register_parameter("bias", torch::zeros({out}, parameter_options(mesh)));
  const char* k_axis = feature_axis(input_side);
  const char* j_axis = batch_axis(input_side);
  i_group_ = mesh.group(kZ);
  j_group_ = mesh.group(j_axis);
  k_group_ = mesh.group(k_axis);
  // Created on every rank in the same order (the same model everywhere), as multi-axis groups require.
  if (spec.bias) ik_group_ = mesh.group(std::vector<std::string>{k_axis, kZ});
}

torch::Tensor Linear3dImpl::forward(const torch::Tensor& x) {
  check_block(x, spec_.in / k_group_->size(), "Linear3d");
  const torch::Tensor a = spec_.order == WeightOrder::kInOut ? weight : weight.t();  // A block [in/q^2, out/q]
  torch::Tensor y = Matmul3d::apply(x, a, i_group_, j_group_, k_group_);
  // b_j is replicated over I and K: forward identity, backward sums db over those ranks.
  return bias.defined() ? y + dist::autograd::copy_to_group(bias, ik_group_) : y;
}

std::map<std::string, Layout> Linear3dImpl::parameter_layouts() const {
  const int64_t in_dim = spec_.order == WeightOrder::kInOut ? 0 : 1;
  const std::string k_axis = feature_axis(input_side_), j_axis = batch_axis(input_side_);
  std::map<std::string, Layout> layouts = {
      {"weight", {{in_dim, {k_axis, kZ}, 1}, {1 - in_dim, {j_axis}, spec_.stride}}}};
  if (bias.defined()) layouts["bias"] = {{0, {j_axis}, spec_.stride}};
  return layouts;
}

// ---- LayerNorm3d ----

LayerNorm3dImpl::LayerNorm3dImpl(int64_t hidden, const dist::ProcessMesh& mesh, Side3d side, double eps)
    : eps_(eps), side_(side) {
  const int64_t q = cube_side_3d(mesh);
  check_divisible(hidden, q, "LayerNorm3d hidden size", q);
  weight = register_parameter("weight", torch::ones({hidden / q}, parameter_options(mesh)));
  bias = register_parameter("bias", torch::zeros({hidden / q}, parameter_options(mesh)));
  feature_group_ = mesh.group(feature_axis(side));
  replica_group_ = mesh.group(std::vector<std::string>{batch_axis(side), kZ});
}

torch::Tensor LayerNorm3dImpl::forward(const torch::Tensor& x) {
  check_block(x, weight.size(0), "LayerNorm3d");
  // Statistics over the full hidden size: the feature blocks lie along F (summa.h's row normalisation).
  const torch::Tensor x_hat = summa::NormalizeAlongRow::apply(x, feature_group_, eps_);
  // γ_f, β_f are replicated over G and tp_z: their gradients are summed over those ranks in backward.
  return x_hat * dist::autograd::copy_to_group(weight, replica_group_) +
         dist::autograd::copy_to_group(bias, replica_group_);
}

std::map<std::string, Layout> LayerNorm3dImpl::parameter_layouts() const {
  return {{"weight", {{0, {feature_axis(side_)}, 1}}}, {"bias", {{0, {feature_axis(side_)}, 1}}}};
}

// ---- Embedding3d ----

Embedding3dImpl::Embedding3dImpl(int64_t vocab, int64_t hidden, const dist::ProcessMesh& mesh) {
  const int64_t q = cube_side_3d(mesh);
  check_divisible(vocab, q, "Embedding3d vocabulary size", q);
  check_divisible(hidden, q * q, "Embedding3d embedding size", q);
  weight = register_parameter("weight", torch::zeros({vocab / q, hidden / (q * q)}, parameter_options(mesh)));
  x_group_ = mesh.group(kX);
  y_group_ = mesh.group(kY);
  z_group_ = mesh.group(kZ);
  input_rows_ = mesh.group(std::vector<std::string>{kX, kZ});
  output_rows_ = mesh.group(std::vector<std::string>{kY, kZ});
}

torch::Tensor Embedding3dImpl::forward(const torch::Tensor& ids) {
  const torch::Tensor features_b = dist::autograd::all_gather(weight, z_group_, /*dim=*/1);  // [V/q, H/q]
  const torch::Tensor table = dist::autograd::all_gather(features_b, x_group_, /*dim=*/0);   // [V, H/q]
  return torch::embedding(table, rows_block(ids, *input_rows_));
}

torch::Tensor Embedding3dImpl::logits(const torch::Tensor& hidden) {
  check_block(hidden, weight.size(1) * z_group_->size(), "Embedding3d logits");
  // Linear3d from side kY: I = tp_z, J = tp_x, K = tp_y; E^T is the [in/q^2, out/q] weight block.
  return Matmul3d::apply(hidden, weight.t(), z_group_, x_group_, y_group_);
}

torch::Tensor Embedding3dImpl::cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return blocked_cross_entropy(logits, rows_block(targets, *output_rows_), x_group_, output_rows_);
}

torch::Tensor Embedding3dImpl::gather_logits(const torch::Tensor& logits) {
  return gather_blocked_logits(logits, x_group_, output_rows_);
}

std::map<std::string, Layout> Embedding3dImpl::parameter_layouts() const {
  return {{"weight", {{0, {kX}, 1}, {1, {kY, kZ}, 1}}}};
}

}  // namespace kuafu::parallel
