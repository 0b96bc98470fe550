// Internal to the 2D and 2.5D (grid) layers: SUMMA's block product and the feature-split normalisation as
// autograd functions over a given grid row and column group, and the grid linear's parameters and
// layouts (header-only, shared by both modes).
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "core/dist/collectives.h"
#include "core/dist/process_group.h"
#include "core/parallel/tensor/layout.h"
#include "core/parallel/tensor/linear_1d.h"

namespace kuafu::parallel::summa {

// The grid's groups travel through the autograd context as capsules holding a reference, so a
// backward pass keeps them alive however long the layer lives.
struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(dist::GroupPtr g) : group(std::move(g)) {}
  dist::GroupPtr group;
};
inline void save_group(torch::autograd::AutogradContext* ctx, const char* key, dist::GroupPtr group) {
  ctx->saved_data[key] = c10::IValue::make_capsule(c10::make_intrusive<GroupHolder>(std::move(group)));
}
inline dist::GroupPtr saved_group(torch::autograd::AutogradContext* ctx, const char* key) {
  return static_cast<GroupHolder*>(ctx->saved_data[key].toCapsule().get())->group;
}

// Block k of a grid row or column: group rank k sends its `mine`, every rank returns the block (a
// fresh tensor everywhere, so a saved input or a parameter is never written through an alias).
inline torch::Tensor broadcast_block(const torch::Tensor& mine, const dist::ProcessGroup& group, int k) {
  torch::Tensor block = group.rank() == k ? mine.clone(at::MemoryFormat::Contiguous)
                                          : torch::empty_like(mine, at::MemoryFormat::Contiguous);
  dist::broadcast(block, group, k);
  return block;
}

inline torch::Tensor rows_of(const torch::Tensor& t) { return t.reshape({-1, t.size(-1)}); }  // [N, features]

// Y_ij = Σ_k X_ik A_kj on rank (i, j) of a q x q grid, with its gradients written out (see
// layers_grid.h). `row` holds the ranks (i, ·) (group rank j), `col` the ranks (·, j) (group rank i).
// `a` is the [in/q, out/q] view of the weight whatever its storage order; autograd carries dA
// through the view. dA is the sum over this grid only (a 2.5D layer sums it over its depth after).
struct Summa : torch::autograd::Function<Summa> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& a,
                               dist::GroupPtr row, dist::GroupPtr col) {
    torch::Tensor y;
    for (int k = 0; k < row->size(); ++k) {
      const torch::Tensor x_k = broadcast_block(x, *row, k);  // X_ik from rank (i, k)
      const torch::Tensor a_k = broadcast_block(a, *col, k);  // A_kj from rank (k, j)
      y = k == 0 ? torch::matmul(x_k, a_k) : y.add_(torch::matmul(x_k, a_k));
    }
    ctx->save_for_backward({x, a});
    save_group(ctx, "row", std::move(row));
    save_group(ctx, "col", std::move(col));
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];  // X_ij [B/q, ..., in/q]
    const torch::Tensor& a = saved[1];  // A_ij [in/q, out/q]
    const dist::GroupPtr row = saved_group(ctx, "row"), col = saved_group(ctx, "col");
    const int i = col->rank(), j = row->rank();
    const torch::Tensor dy = grads[0].contiguous();  // dY_ij [B/q, ..., out/q]
    // Every rank of a row (column) agrees on which inputs need a gradient: they run the same model.
    const bool want_dx = ctx->needs_input_grad(0), want_da = ctx->needs_input_grad(1);
    torch::Tensor dx, da;
    for (int k = 0; k < row->size(); ++k) {
      if (want_dx) {
        // dX_ik = Σ_j dY_ij A_kj^T: this rank's term, summed along row i onto rank (i, k).
        const torch::Tensor a_k = broadcast_block(a, *col, k);
        torch::Tensor term = torch::matmul(dy, a_k.t()).contiguous();
        dist::reduce(term, *row, /*root=*/k);
        if (j == k) dx = term;
      }
      if (want_da) {
        // dA_kj = Σ_i X_ik^T dY_ij: this rank's term, summed down column j onto rank (k, j).
        const torch::Tensor x_k = broadcast_block(x, *row, k);
        torch::Tensor term = torch::matmul(rows_of(x_k).t(), rows_of(dy)).contiguous();
        dist::reduce(term, *col, /*root=*/k);
        if (i == k) da = term;
      }
    }
    return {dx, da, torch::Tensor(), torch::Tensor()};
  }
};

// x̂ = (x - μ) / sqrt(σ² + ε) over the full hidden size H, features cut along the grid row.
//
// Why the backward is exact: x̂ depends on the whole row of H features, with Jacobian
//   ∂x̂_h / ∂x_m = (δ_hm - 1/H - x̂_h x̂_m / H) / σ      (σ = sqrt(σ² + ε))
// so for g = dL/dx̂,
//   dL/dx_m = (g_m - (1/H) Σ_h g_h - x̂_m (1/H) Σ_h g_h x̂_h) / σ,
// where h runs over all H features: the two sums are local sums all-reduced along the row (in one
// message). g_h is the whole gradient of x̂_h because the loss counts each block once and the block
// holding feature h lives on exactly one rank of the row.
struct NormalizeAlongRow : torch::autograd::Function<NormalizeAlongRow> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, dist::GroupPtr row,
                               double eps) {
    const double hidden = static_cast<double>(x.size(-1) * row->size());
    torch::Tensor mean = x.sum(-1, /*keepdim=*/true);
    dist::all_reduce(mean, *row);
    mean.div_(hidden);
    const torch::Tensor centred = x - mean;
    torch::Tensor var = (centred * centred).sum(-1, /*keepdim=*/true);
    dist::all_reduce(var, *row);
    const torch::Tensor rstd = (var.div_(hidden) + eps).rsqrt();  // 1/σ  [B/q, ..., 1]
    torch::Tensor x_hat = centred * rstd;
    ctx->save_for_backward({x_hat, rstd});
    save_group(ctx, "row", std::move(row));
    return x_hat;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x_hat = saved[0];
    const torch::Tensor& rstd = saved[1];
    const dist::GroupPtr row = saved_group(ctx, "row");
    const torch::Tensor& g = grads[0];
    const double hidden = static_cast<double>(x_hat.size(-1) * row->size());
    // [2, B/q, ..., 1]: Σ_h g_h and Σ_h g_h x̂_h over the whole row.
    torch::Tensor sums = torch::stack({g.sum(-1, /*keepdim=*/true), (g * x_hat).sum(-1, /*keepdim=*/true)});
    dist::all_reduce(sums, *row);
    sums.div_(hidden);
    torch::Tensor dx = (g - sums[0] - x_hat * sums[1]) * rstd;
    return {dx, torch::Tensor(), torch::Tensor()};
  }
};

// A grid linear layer's parameters (2D and 2.5D alike): A_ij [in/q, out/q] in storage order, and b_j
// [out/q] when the spec has a bias (returned undefined otherwise), made with `options`.
inline std::pair<torch::Tensor, torch::Tensor> register_grid_linear(torch::nn::Module& module, const LinearSpec& spec,
                                                                    int64_t q, const torch::TensorOptions& options) {
  const int64_t in = spec.in / q, out = spec.out / q;
  torch::Tensor weight = module.register_parameter(
      "weight", spec.order == WeightOrder::kInOut ? torch::zeros({in, out}, options) : torch::zeros({out, in}, options));
  torch::Tensor bias = spec.bias ? module.register_parameter("bias", torch::zeros({out}, options)) : torch::Tensor();
  return {weight, bias};
}

// Their layouts: A's input features cut over tp_row and output features (per stride segment) over
// tp_col, b_j likewise over tp_col (any further replication, e.g. over tp_dep, is not a cut).
inline std::map<std::string, Layout> grid_linear_layouts(WeightOrder order, bool has_bias, int64_t stride) {
  const int64_t in_dim = order == WeightOrder::kInOut ? 0 : 1;
  std::map<std::string, Layout> layouts = {{"weight", {{in_dim, {"tp_row"}, 1}, {1 - in_dim, {"tp_col"}, stride}}}};
  if (has_bias) layouts["bias"] = {{0, {"tp_col"}, stride}};
  return layouts;
}

}  // namespace kuafu::parallel::summa
