#include "core/parallel/tensor/layers_2d.h"

#include "core/dist/autograd_collectives.h"
#include "core/dist/collectives.h"
#include "core/parallel/tensor/summa.h"
#include "core/parallel/tensor/vocab_parallel.h"
#include "core/util/error.h"

namespace kuafu::parallel {
namespace {

using summa::rows_of;

constexpr const char* kRow = "tp_row";  // axis of i: moving along it walks down a grid column
constexpr const char* kCol = "tp_col";  // axis of j: moving along it walks along a grid row

void check_divisible(int64_t size, int64_t q, const char* what, const char* hint = "") {
  KUAFU_CHECK(size % q == 0, "2D tensor parallelism: ", what, " ", size, " is not divisible by the grid side q = ", q,
              " (", q * q, " ranks as ", q, " x ", q, ")", hint);
}

void check_block(const torch::Tensor& x, int64_t features, const char* layer) {
  KUAFU_CHECK(x.dim() >= 2 && x.size(-1) == features, layer, " expects an activation block [B/q, ..., ", features,
              "] (batch rows over tp_row, features over tp_col), got ", x.sizes());
}

}  // namespace

int grid_side_2d(const dist::ProcessMesh& mesh) {
  bool has_row = false, has_col = false;
  for (const auto& axis : mesh.axes()) {
    has_row = has_row || axis.name == kRow;
    has_col = has_col || axis.name == kCol;
  }
  KUAFU_CHECK(has_row && has_col, "2D tensor parallelism needs mesh axes 'tp_row' and 'tp_col', but the mesh is ",
              mesh.describe());
  KUAFU_CHECK(mesh.size(kRow) == mesh.size(kCol), "2D tensor parallelism needs a square grid, but tp_row = ",
              mesh.size(kRow), " and tp_col = ", mesh.size(kCol));
  return mesh.size(kRow);
}

Layout activation_layout_2d(int64_t dims) {
  KUAFU_CHECK(dims >= 2, "a 2D activation needs a batch and a feature dimension, got ", dims, " dimension(s)");
  return {{0, {kRow}, 1}, {dims - 1, {kCol}, 1}};
}

Layout batch_layout_2d() { return {{0, {kRow}, 1}}; }

torch::Tensor split_activation_2d(const torch::Tensor& full, const dist::ProcessMesh& mesh) {
  grid_side_2d(mesh);
  return shard_of(full, activation_layout_2d(full.dim()), mesh);
}

torch::Tensor gather_activation_2d(const torch::Tensor& block, const dist::ProcessMesh& mesh) {
  grid_side_2d(mesh);
  return gather_full(block, activation_layout_2d(block.dim()), mesh);
}

// ---- Linear2d ----

Linear2dImpl::Linear2dImpl(const LinearSpec& spec, const dist::ProcessMesh& mesh) : spec_(spec) {
  const int64_t q = grid_side_2d(mesh);
  KUAFU_CHECK(spec.stride == 1, "Linear2d: stride ", spec.stride, " is not supported (2D layers cut whole "
              "features; a fused q|k|v projection needs stride 1 here, e.g. three separate layers)");
  check_divisible(spec.in, q, "input features");
  check_divisible(spec.out, q, "output features");
  std::tie(weight, bias) = summa::register_grid_linear(*this, spec, q);
  row_group_ = mesh.group(kCol);
  col_group_ = mesh.group(kRow);
}

torch::Tensor Linear2dImpl::forward(const torch::Tensor& x) {
  check_block(x, weight.size(spec_.order == WeightOrder::kInOut ? 0 : 1), "Linear2d");
  const torch::Tensor a = spec_.order == WeightOrder::kInOut ? weight : weight.t();  // A_ij [in/q, out/q]
  torch::Tensor y = summa::Summa::apply(x, a, row_group_, col_group_);
  // b_j is replicated down column j: forward identity, backward sums db over tp_row.
  return bias.defined() ? y + dist::autograd::copy_to_group(bias, col_group_) : y;
}

std::map<std::string, Layout> Linear2dImpl::parameter_layouts() const {
  return summa::grid_linear_layouts(spec_.order, bias.defined());
}

// ---- LayerNorm2d ----

LayerNorm2dImpl::LayerNorm2dImpl(int64_t hidden, const dist::ProcessMesh& mesh, double eps) : eps_(eps) {
  const int64_t q = grid_side_2d(mesh);
  check_divisible(hidden, q, "LayerNorm2d hidden size");
  weight = register_parameter("weight", torch::ones({hidden / q}));
  bias = register_parameter("bias", torch::zeros({hidden / q}));
  row_group_ = mesh.group(kCol);
  col_group_ = mesh.group(kRow);
}

torch::Tensor LayerNorm2dImpl::forward(const torch::Tensor& x) {
  check_block(x, weight.size(0), "LayerNorm2d");
  const torch::Tensor x_hat = summa::NormalizeAlongRow::apply(x, row_group_, eps_);
  // γ_j, β_j are replicated down column j: their gradients are summed over tp_row in backward.
  return x_hat * dist::autograd::copy_to_group(weight, col_group_) + dist::autograd::copy_to_group(bias, col_group_);
}

std::map<std::string, Layout> LayerNorm2dImpl::parameter_layouts() const {
  return {{"weight", {{0, {kCol}, 1}}}, {"bias", {{0, {kCol}, 1}}}};
}

// ---- Embedding2d ----

Embedding2dImpl::Embedding2dImpl(int64_t vocab, int64_t hidden, const dist::ProcessMesh& mesh) {
  const int64_t q = grid_side_2d(mesh);
  check_divisible(vocab, q, "Embedding2d vocabulary size", "; pad the vocabulary");
  check_divisible(hidden, q, "Embedding2d hidden size");
  weight = register_parameter("weight", torch::zeros({vocab / q, hidden / q}));
  col_group_ = mesh.group(kRow);
}

torch::Tensor Embedding2dImpl::forward(const torch::Tensor& ids) {
  const torch::Tensor table = dist::autograd::all_gather(weight, col_group_, /*dim=*/0);  // E_·j [V, H/q]
  return torch::embedding(table, ids);
}

std::map<std::string, Layout> Embedding2dImpl::parameter_layouts() const {
  return {{"weight", {{0, {kRow}, 1}, {1, {kCol}, 1}}}};
}

// ---- Cross-entropy ----

torch::Tensor cross_entropy_2d(const torch::Tensor& logits, const torch::Tensor& targets,
                               const dist::ProcessMesh& mesh) {
  const int64_t q = grid_side_2d(mesh);
  KUAFU_CHECK(logits.dim() == targets.dim() + 1 && logits.sizes().slice(0, targets.dim()) == targets.sizes(),
              "cross_entropy_2d: logits [B/q, ..., V/q] and targets [B/q, ...], got ", logits.sizes(), " and ",
              targets.sizes());
  const int64_t vocab_block = logits.size(-1);
  // loss_i: mean over grid row i's tokens, the same on every rank of the row.
  const torch::Tensor row_mean = vocab_parallel_cross_entropy(
      rows_of(logits), targets.reshape({-1}), mesh.coordinate(kCol) * vocab_block, mesh.group(kCol));
  // L = (1/q) Σ_i loss_i: all-reduce down the column forward; backward is the identity, since
  // ∂L/∂logits_ij = (1/q) ∂loss_i/∂logits_ij is what rank (i, j) computes from its own row's loss.
  return dist::autograd::reduce_from_group(row_mean / static_cast<double>(q), mesh.group(kRow));
}

}  // namespace kuafu::parallel
