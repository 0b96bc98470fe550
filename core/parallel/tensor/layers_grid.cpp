#include "core/parallel/tensor/layers_grid.h"

#include "core/dist/autograd_collectives.h"
#include "core/dist/collectives.h"
#include "core/parallel/tensor/summa.h"
#include "core/parallel/tensor/vocab_parallel.h"
#include "core/util/error.h"

namespace kuafu::parallel {
namespace {

using summa::rows_of;

constexpr const char* kDep = "tp_dep";  // axis of h: which stacked grid
constexpr const char* kRow = "tp_row";  // axis of i: moving along it walks down a grid column
constexpr const char* kCol = "tp_col";  // axis of j: moving along it walks along a grid row

std::string mode_of(const GridShape& grid) { return grid.has_depth ? "2.5D" : "2D"; }

void check_divisible(int64_t size, const GridShape& grid, const char* what, const char* hint = "") {
  KUAFU_CHECK(size % grid.q == 0, mode_of(grid), " tensor parallelism: ", what, " ", size,
              " is not divisible by the grid side q = ", grid.q, " (", grid.d * grid.q * grid.q, " ranks as ",
              grid.has_depth ? std::to_string(grid.d) + " x " : std::string(), grid.q, " x ", grid.q, ")", hint);
}

void check_block(const torch::Tensor& x, int64_t features, const char* layer, bool depth) {
  KUAFU_CHECK(x.dim() >= 2 && x.size(-1) == features, layer, " expects an activation block [",
              depth ? "B/(dq)" : "B/q", ", ..., ", features, "] (batch rows over ", depth ? "tp_dep and " : "",
              "tp_row, features over tp_col), got ", x.sizes());
}

// The replicas of a tensor along `group` (null: none): forward identity, backward sums the gradient.
torch::Tensor replicated(const torch::Tensor& t, const dist::GroupPtr& group) {
  return group ? dist::autograd::copy_to_group(t, group) : t;
}

dist::GroupPtr depth_group(const dist::ProcessMesh& mesh, const GridShape& grid) {
  return grid.has_depth ? mesh.group(kDep) : nullptr;
}

// logits = X E^T by SUMMA with E cut like a grid weight (layers_grid.h): `x` X_hij [rows, H/q], `e`
// E_ij [V/q, H/q]; returns Z_hij [rows, V/q].
struct SummaTransposed : torch::autograd::Function<SummaTransposed> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& e,
                               dist::GroupPtr row, dist::GroupPtr col) {
    const int j = row->rank();
    torch::Tensor z;
    for (int l = 0; l < row->size(); ++l) {
      const torch::Tensor e_l = summa::broadcast_block(e, *col, l);  // E_lj from rank (h, l, j)
      torch::Tensor term = torch::matmul(x, e_l.t()).contiguous();    // this rank's term of Z_hil
      dist::reduce(term, *row, /*root=*/l);
      if (j == l) z = term;
    }
    ctx->save_for_backward({x, e});
    summa::save_group(ctx, "row", std::move(row));
    summa::save_group(ctx, "col", std::move(col));
    return z;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& e = saved[1];
    const dist::GroupPtr row = summa::saved_group(ctx, "row"), col = summa::saved_group(ctx, "col");
    const int i = col->rank();
    const torch::Tensor dz = grads[0].contiguous();  // dZ_hij
    const bool want_dx = ctx->needs_input_grad(0), want_de = ctx->needs_input_grad(1);
    torch::Tensor dx, de;
    for (int l = 0; l < row->size(); ++l) {
      const torch::Tensor dz_l = summa::broadcast_block(dz, *row, l);  // dZ_hil from rank (h, i, l)
      if (want_dx) {
        const torch::Tensor term = torch::matmul(dz_l, summa::broadcast_block(e, *col, l));  // dZ_hil E_lj
        dx = l == 0 ? term : dx.add_(term);
      }
      if (want_de) {
        // dE_lj = Σ_i dZ_hil^T X_hij: this rank's term, summed down column j onto rank (h, l, j).
        torch::Tensor term = torch::matmul(rows_of(dz_l).t(), rows_of(x)).contiguous();
        dist::reduce(term, *col, /*root=*/l);
        if (i == l) de = term;
      }
    }
    return {dx, de, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::vector<std::string> GridShape::row_axes() const {
  return has_depth ? std::vector<std::string>{kDep, kRow} : std::vector<std::string>{kRow};
}

GridShape grid_shape(const dist::ProcessMesh& mesh) {
  bool has_row = false, has_col = false;
  GridShape grid;
  for (const auto& axis : mesh.axes()) {
    grid.has_depth = grid.has_depth || axis.name == kDep;
    has_row = has_row || axis.name == kRow;
    has_col = has_col || axis.name == kCol;
  }
  KUAFU_CHECK(has_row && has_col, "2D and 2.5D tensor parallelism need mesh axes 'tp_row' and 'tp_col' (and "
              "'tp_dep' for 2.5D), but the mesh is ", mesh.describe());
  KUAFU_CHECK(mesh.size(kRow) == mesh.size(kCol), "2D and 2.5D tensor parallelism need square grids, but tp_row = ",
              mesh.size(kRow), " and tp_col = ", mesh.size(kCol));
  grid.q = mesh.size(kRow);
  grid.d = grid.has_depth ? mesh.size(kDep) : 1;
  return grid;
}

Layout grid_activation_layout(int64_t dims, const dist::ProcessMesh& mesh) {
  KUAFU_CHECK(dims >= 2, "a grid activation needs a batch and a feature dimension, got ", dims, " dimension(s)");
  return {{0, grid_shape(mesh).row_axes(), 1}, {dims - 1, {kCol}, 1}};
}

Layout grid_batch_layout(const dist::ProcessMesh& mesh) { return {{0, grid_shape(mesh).row_axes(), 1}}; }

torch::Tensor split_activation_grid(const torch::Tensor& full, const dist::ProcessMesh& mesh) {
  const GridShape grid = grid_shape(mesh);
  KUAFU_CHECK(full.dim() >= 2, "a grid activation needs a batch and a feature dimension, got ", full.sizes());
  const std::string blocks = grid.has_depth ? "d x q = " + std::to_string(grid.d) + " x " + std::to_string(grid.q) +
                                                   " = " + std::to_string(grid.d * grid.q) + " row blocks (tp_dep x tp_row)"
                                             : "q = " + std::to_string(grid.q) + " row blocks (tp_row)";
  KUAFU_CHECK(full.size(0) % (grid.d * grid.q) == 0, mode_of(grid), " tensor parallelism: the batch size ",
              full.size(0), " does not divide into ", blocks, "; use a batch that is a multiple of ", grid.d * grid.q);
  check_divisible(full.size(-1), grid, "the feature size");
  return shard_of(full, grid_activation_layout(full.dim(), mesh), mesh);
}

torch::Tensor gather_activation_grid(const torch::Tensor& block, const dist::ProcessMesh& mesh) {
  return gather_full(block, grid_activation_layout(block.dim(), mesh), mesh);
}

// ---- GridLinear ----

GridLinearImpl::GridLinearImpl(const LinearSpec& spec, const dist::ProcessMesh& mesh) : spec_(spec) {
  const GridShape grid = grid_shape(mesh);
  KUAFU_CHECK(spec.stride >= 1 && spec.out % spec.stride == 0, "GridLinear: output features ", spec.out,
              " do not split into stride ", spec.stride, " segments");
  check_divisible(spec.in, grid, "input features");
  check_divisible(spec.out / spec.stride, grid, spec.stride > 1 ? "output features per stride segment" : "output features");
  std::tie(weight, bias) = summa::register_grid_linear(*this, spec, grid.q, parameter_options(mesh));
  row_group_ = mesh.group(kCol);
  col_group_ = mesh.group(kRow);
  depth_group_ = depth_group(mesh, grid);
  replicas_group_ = mesh.group(grid.row_axes());
}

torch::Tensor GridLinearImpl::forward(const torch::Tensor& x) {
  check_block(x, weight.size(spec_.order == WeightOrder::kInOut ? 0 : 1), "GridLinear", depth_group_ != nullptr);
  // A_ij is replicated over the depth: forward identity, backward sums the grids' dA_ij over tp_dep.
  const torch::Tensor w = replicated(weight, depth_group_);
  const torch::Tensor a = spec_.order == WeightOrder::kInOut ? w : w.t();  // A_ij [in/q, out/q]
  torch::Tensor y = summa::Summa::apply(x, a, row_group_, col_group_);
  // b_j is replicated over tp_row and tp_dep: backward sums db over both.
  return bias.defined() ? y + dist::autograd::copy_to_group(bias, replicas_group_) : y;
}

std::map<std::string, Layout> GridLinearImpl::parameter_layouts() const {
  return summa::grid_linear_layouts(spec_.order, bias.defined(), spec_.stride);
}

// ---- GridLayerNorm ----

GridLayerNormImpl::GridLayerNormImpl(int64_t hidden, const dist::ProcessMesh& mesh, double eps) : eps_(eps) {
  const GridShape grid = grid_shape(mesh);
  has_depth_ = grid.has_depth;
  check_divisible(hidden, grid, "LayerNorm hidden size");
  weight = register_parameter("weight", torch::ones({hidden / grid.q}, parameter_options(mesh)));
  bias = register_parameter("bias", torch::zeros({hidden / grid.q}, parameter_options(mesh)));
  row_group_ = mesh.group(kCol);
  replicas_group_ = mesh.group(grid.row_axes());
}

torch::Tensor GridLayerNormImpl::forward(const torch::Tensor& x) {
  check_block(x, weight.size(0), "GridLayerNorm", has_depth_);
  const torch::Tensor x_hat = summa::NormalizeAlongRow::apply(x, row_group_, eps_);
  // γ_j, β_j are replicated over tp_row and tp_dep: their gradients are summed over both in backward.
  return x_hat * dist::autograd::copy_to_group(weight, replicas_group_) +
         dist::autograd::copy_to_group(bias, replicas_group_);
}

std::map<std::string, Layout> GridLayerNormImpl::parameter_layouts() const {
  return {{"weight", {{0, {kCol}, 1}}}, {"bias", {{0, {kCol}, 1}}}};
}

// ---- GridEmbedding ----

GridEmbeddingImpl::GridEmbeddingImpl(int64_t vocab, int64_t hidden, const dist::ProcessMesh& mesh) {
  const GridShape grid = grid_shape(mesh);
  check_divisible(vocab, grid, "vocabulary size", "; pad the vocabulary");
  check_divisible(hidden, grid, "embedding size");
  weight = register_parameter("weight", torch::zeros({vocab / grid.q, hidden / grid.q}, parameter_options(mesh)));
  row_group_ = mesh.group(kCol);
  col_group_ = mesh.group(kRow);
  depth_group_ = depth_group(mesh, grid);
  replicas_group_ = mesh.group(grid.row_axes());
}

torch::Tensor GridEmbeddingImpl::forward(const torch::Tensor& ids) {
  const torch::Tensor table =
      dist::autograd::all_gather(replicated(weight, depth_group_), col_group_, /*dim=*/0);  // E_·j [V, H/q]
  return torch::embedding(table, rows_block(ids, *replicas_group_));
}

torch::Tensor GridEmbeddingImpl::logits(const torch::Tensor& hidden) {
  check_block(hidden, weight.size(1), "GridEmbedding logits", depth_group_ != nullptr);
  return SummaTransposed::apply(hidden, replicated(weight, depth_group_), row_group_, col_group_);
}

torch::Tensor GridEmbeddingImpl::cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return blocked_cross_entropy(logits, rows_block(targets, *replicas_group_), row_group_, replicas_group_);
}

torch::Tensor GridEmbeddingImpl::gather_logits(const torch::Tensor& logits) {
  return gather_blocked_logits(logits, row_group_, replicas_group_);
}

std::map<std::string, Layout> GridEmbeddingImpl::parameter_layouts() const {
  return {{"weight", {{0, {kRow}, 1}, {1, {kCol}, 1}}}};
}

// ---- Cross-entropy ----

torch::Tensor grid_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                 const dist::ProcessMesh& mesh) {
  return blocked_cross_entropy(logits, targets, mesh.group(kCol), mesh.group(grid_shape(mesh).row_axes()));
}

}  // namespace kuafu::parallel
