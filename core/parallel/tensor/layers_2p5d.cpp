#include "core/parallel/tensor/layers_2p5d.h"

#include "core/dist/autograd_collectives.h"
#include "core/parallel/tensor/summa.h"
#include "core/util/error.h"

namespace kuafu::parallel {
namespace {

constexpr const char* kDep = "tp_dep";  // axis of h: which stacked grid
constexpr const char* kRow = "tp_row";  // axis of i: moving along it walks down a grid column
constexpr const char* kCol = "tp_col";  // axis of j: moving along it walks along a grid row

void check_divisible(int64_t size, const dist::ProcessMesh& mesh, const char* what) {
  const int64_t d = mesh.size(kDep), q = mesh.size(kRow);
  KUAFU_CHECK(size % q == 0, "2.5D tensor parallelism: ", what, " ", size, " is not divisible by the grid side q = ",
              q, " (", d * q * q, " ranks as ", d, " x ", q, " x ", q, ")");
}

void check_block(const torch::Tensor& x, int64_t features, const char* layer) {
  KUAFU_CHECK(x.dim() >= 2 && x.size(-1) == features, layer, " expects an activation block [B/(dq), ..., ", features,
              "] (batch rows over tp_dep and tp_row, features over tp_col), got ", x.sizes());
}

}  // namespace

int grid_side_2p5d(const dist::ProcessMesh& mesh) {
  bool has_dep = false, has_row = false, has_col = false;
  for (const auto& axis : mesh.axes()) {
    has_dep = has_dep || axis.name == kDep;
    has_row = has_row || axis.name == kRow;
    has_col = has_col || axis.name == kCol;
  }
  KUAFU_CHECK(has_dep && has_row && has_col,
              "2.5D tensor parallelism needs mesh axes 'tp_dep', 'tp_row' and 'tp_col', but the mesh is ",
              mesh.describe());
  KUAFU_CHECK(mesh.size(kRow) == mesh.size(kCol), "2.5D tensor parallelism needs square grids, but tp_row = ",
              mesh.size(kRow), " and tp_col = ", mesh.size(kCol));
  return mesh.size(kRow);
}

int depth_2p5d(const dist::ProcessMesh& mesh) {
  grid_side_2p5d(mesh);
  return mesh.size(kDep);
}

Layout activation_layout_2p5d(int64_t dims) {
  KUAFU_CHECK(dims >= 2, "a 2.5D activation needs a batch and a feature dimension, got ", dims, " dimension(s)");
  return {{0, {kDep, kRow}, 1}, {dims - 1, {kCol}, 1}};
}

Layout batch_layout_2p5d() { return {{0, {kDep, kRow}, 1}}; }

torch::Tensor split_activation_2p5d(const torch::Tensor& full, const dist::ProcessMesh& mesh) {
  const int64_t q = grid_side_2p5d(mesh), d = mesh.size(kDep);
  KUAFU_CHECK(full.dim() >= 2, "a 2.5D activation needs a batch and a feature dimension, got ", full.sizes());
  KUAFU_CHECK(full.size(0) % (d * q) == 0, "2.5D tensor parallelism: the batch size ", full.size(0),
              " does not divide into d x q = ", d, " x ", q, " = ", d * q,
              " row blocks (tp_dep x tp_row); use a batch that is a multiple of ", d * q);
  KUAFU_CHECK(full.size(-1) % q == 0, "2.5D tensor parallelism: the feature size ", full.size(-1),
              " does not divide into q = ", q, " blocks (tp_col)");
  return shard_of(full, activation_layout_2p5d(full.dim()), mesh);
}

torch::Tensor gather_activation_2p5d(const torch::Tensor& block, const dist::ProcessMesh& mesh) {
  grid_side_2p5d(mesh);
  return gather_full(block, activation_layout_2p5d(block.dim()), mesh);
}

// ---- Linear2p5d ----

Linear2p5dImpl::Linear2p5dImpl(const LinearSpec& spec, const dist::ProcessMesh& mesh) : spec_(spec) {
  const int64_t q = grid_side_2p5d(mesh);
  KUAFU_CHECK(spec.stride == 1, "Linear2p5d: stride ", spec.stride, " is not supported (2.5D layers cut whole "
              "features; a fused q|k|v projection needs stride 1 here, e.g. three separate layers)");
  check_divisible(spec.in, mesh, "input features");
  check_divisible(spec.out, mesh, "output features");
  std::tie(weight, bias) = summa::register_grid_linear(*this, spec, q);
  row_group_ = mesh.group(kCol);
  col_group_ = mesh.group(kRow);
  depth_group_ = mesh.group(kDep);
  replicas_group_ = mesh.group(std::vector<std::string>{kDep, kRow});
}

torch::Tensor Linear2p5dImpl::forward(const torch::Tensor& x) {
  check_block(x, weight.size(spec_.order == WeightOrder::kInOut ? 0 : 1), "Linear2p5d");
  // A_ij is replicated over the depth: forward identity, backward sums the layers' dA_ij over tp_dep.
  const torch::Tensor w = dist::autograd::copy_to_group(weight, depth_group_);
  const torch::Tensor a = spec_.order == WeightOrder::kInOut ? w : w.t();  // A_ij [in/q, out/q]
  torch::Tensor y = summa::Summa::apply(x, a, row_group_, col_group_);
  // b_j is replicated over tp_row and tp_dep: backward sums db over both.
  return bias.defined() ? y + dist::autograd::copy_to_group(bias, replicas_group_) : y;
}

std::map<std::string, Layout> Linear2p5dImpl::parameter_layouts() const {
  return summa::grid_linear_layouts(spec_.order, bias.defined());
}

// ---- LayerNorm2p5d ----

LayerNorm2p5dImpl::LayerNorm2p5dImpl(int64_t hidden, const dist::ProcessMesh& mesh, double eps) : eps_(eps) {
  const int64_t q = grid_side_2p5d(mesh);
  check_divisible(hidden, mesh, "LayerNorm2p5d hidden size");
  weight = register_parameter("weight", torch::ones({hidden / q}));
  bias = register_parameter("bias", torch::zeros({hidden / q}));
  row_group_ = mesh.group(kCol);
  replicas_group_ = mesh.group(std::vector<std::string>{kDep, kRow});
}

torch::Tensor LayerNorm2p5dImpl::forward(const torch::Tensor& x) {
  check_block(x, weight.size(0), "LayerNorm2p5d");
  const torch::Tensor x_hat = summa::NormalizeAlongRow::apply(x, row_group_, eps_);
  // γ_j, β_j are replicated over tp_row and tp_dep: their gradients are summed over both in backward.
  return x_hat * dist::autograd::copy_to_group(weight, replicas_group_) +
         dist::autograd::copy_to_group(bias, replicas_group_);
}

std::map<std::string, Layout> LayerNorm2p5dImpl::parameter_layouts() const {
  return {{"weight", {{0, {kCol}, 1}}}, {"bias", {{0, {kCol}, 1}}}};
}

}  // namespace kuafu::parallel
