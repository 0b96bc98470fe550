// 2D tensor parallelism (SUMMA, Colossal-AI's "2d" mode): P = q x q ranks on the mesh axes tp_row (i)
// and tp_col (j); weights and activations are both cut into q x q blocks, so no rank holds either whole.
#pragma once

#include "core/parallel/tensor/layout.h"
#include "core/parallel/tensor/linear_1d.h"

namespace kuafu::parallel {

// ---- Activation layout -------------------------------------------------------------------------
// An activation X [B, ..., H] is cut into q x q blocks. Rank (i, j) holds
//   X_ij = X[batch rows block i, ..., features block j]        [B/q, ..., H/q]
// i.e. dim 0 is split over tp_row and the last dim over tp_col; the dims between are whole. Every
// 2D layer takes and returns this layout, so element-wise functions (gelu, residual adds) apply to
// the blocks as they are. Nothing is replicated: the loss is the sum over the ranks of each rank's
// loss on its own blocks (or one value counted once, like cross_entropy_2d's), and the gradient of
// a block lives on the rank that holds it. Token ids and targets [B, ...] are split by batch rows
// only: rank (i, j) holds rows block i, replicated over tp_col.
//
// The grid side q; kuafu::Error unless the mesh has axes tp_row and tp_col of equal size.
int grid_side_2d(const dist::ProcessMesh& mesh);
Layout activation_layout_2d(int64_t dims);  // {{0, {tp_row}}, {dims - 1, {tp_col}}}
Layout batch_layout_2d();                   // {{0, {tp_row}}}: ids, targets
// This rank's block of a full activation, and the full activation from every rank's block
// (collective over the tp_row x tp_col grid).
torch::Tensor split_activation_2d(const torch::Tensor& full, const dist::ProcessMesh& mesh);
torch::Tensor gather_activation_2d(const torch::Tensor& block, const dist::ProcessMesh& mesh);

// ---- Linear ------------------------------------------------------------------------------------
// Y = X A + b by SUMMA. A [in, out] is cut like an activation, b by output features:
//   A_ij = A[in block i, out block j]   [in/q, out/q]   Layout {{in_dim, {tp_row}}, {out_dim, {tp_col}}}
//   b_j  = b[out block j]               [out/q]         replicated over tp_row
// Rank (i, j) builds its output block from q block products:
//   Y_ij = Σ_k X_ik A_kj + b_j
// at step k, rank (i, k) broadcasts X_ik along grid row i and rank (k, j) broadcasts A_kj along grid
// column j. Backward, from dY_ij on rank (i, j):
//   dX_ik = Σ_j dY_ij A_kj^T   every rank of row i computes its term; reduced to rank (i, k)
//   dA_kj = Σ_i X_ik^T dY_ij   every rank of column j computes its term; reduced to rank (k, j)
//   db_j  = Σ_i Σ_rows dY_ij   each row of the grid saw other batch rows: all-reduce over tp_row
// Traffic per rank and call: forward q broadcasts of an X block and q of an A block; backward the
// same broadcasts again (the received blocks are not kept, so memory stays one block, not q) plus q
// reductions of each gradient block.
// Spec: in and out divisible by q; stride must be 1 (a fused q|k|v split is 1D-only).
class Linear2dImpl : public torch::nn::Module, public ShardedModule {
 public:
  Linear2dImpl(const LinearSpec& spec, const dist::ProcessMesh& mesh);
  torch::Tensor forward(const torch::Tensor& x);  // [B/q, ..., in/q] -> [B/q, ..., out/q]
  std::map<std::string, Layout> parameter_layouts() const override;

  torch::Tensor weight;  // [in/q, out/q] (kInOut) or [out/q, in/q] (kOutIn)
  torch::Tensor bias;    // [out/q] (undefined without bias)

 private:
  LinearSpec spec_;
  dist::GroupPtr row_group_;  // ranks (i, ·): this rank's grid row, along tp_col; group rank = j
  dist::GroupPtr col_group_;  // ranks (·, j): this rank's grid column, along tp_row; group rank = i
};
TORCH_MODULE(Linear2d);

// ---- LayerNorm ---------------------------------------------------------------------------------
// LayerNorm over the full hidden size H while rank (i, j) holds features block j [B/q, ..., H/q]:
//   μ  = (1/H) Σ_j Σ_{h ∈ block j} x_h          σ² = (1/H) Σ_j Σ_{h ∈ block j} (x_h - μ)²
//   y_ij = (x_ij - μ) / sqrt(σ² + ε) ⊙ γ_j + β_j
// (both sums all-reduced along the grid row, two-pass as torch computes them). γ_j, β_j are features
// block j, replicated over tp_row; their gradients are summed over tp_row. The normalisation's
// backward is written out in summa.h (one all-reduce along the row).
class LayerNorm2dImpl : public torch::nn::Module, public ShardedModule {
 public:
  LayerNorm2dImpl(int64_t hidden, const dist::ProcessMesh& mesh, double eps = 1e-5);
  torch::Tensor forward(const torch::Tensor& x);  // [B/q, ..., H/q] -> same
  std::map<std::string, Layout> parameter_layouts() const override;

  torch::Tensor weight;  // γ [H/q], ones
  torch::Tensor bias;    // β [H/q], zeros

 private:
  double eps_;
  dist::GroupPtr row_group_;
  dist::GroupPtr col_group_;
};
TORCH_MODULE(LayerNorm2d);

// ---- Embedding and classifier loss -------------------------------------------------------------
// E [V, H] cut like a weight: E_ij = E[vocabulary block i, features block j] [V/q, H/q]. Forward
// gathers the column's blocks, E_·j = [E_0j; ...; E_(q-1)j] [V, H/q] (all-gather along tp_row), and
// looks up this rank's ids (batch rows block i):  X_ij = E_·j[ids_i]  [B/q, ..., H/q], the activation
// layout. Backward: each rank scatters its rows' gradients into [V, H/q]; the reduce-scatter along
// the column sums the q grid rows' contributions and leaves block i on rank (i, j).
class Embedding2dImpl : public torch::nn::Module, public ShardedModule {
 public:
  Embedding2dImpl(int64_t vocab, int64_t hidden, const dist::ProcessMesh& mesh);
  torch::Tensor forward(const torch::Tensor& ids);  // [B/q, ...] -> [B/q, ..., H/q]
  std::map<std::string, Layout> parameter_layouts() const override;

  torch::Tensor weight;  // [V/q, H/q]

 private:
  dist::GroupPtr col_group_;
};
TORCH_MODULE(Embedding2d);

// Mean cross-entropy over all B x ... tokens of logits in the activation layout ([B/q, ..., V/q] on
// rank (i, j), vocabulary block j) against targets [B/q, ...] (batch rows block i, global ids).
// Along each grid row it is the vocabulary-parallel cross-entropy of that row's tokens; the q row
// means (equal token counts) are averaged over tp_row. The value is the same on every rank of the
// grid and counts once: each rank's backward yields the exact gradient of its own logits block.
torch::Tensor cross_entropy_2d(const torch::Tensor& logits, const torch::Tensor& targets,
                               const dist::ProcessMesh& mesh);

}  // namespace kuafu::parallel
