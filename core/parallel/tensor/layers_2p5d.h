// 2.5D tensor parallelism (Tesseract, Colossal-AI's "2.5d" mode): P = d x q x q ranks on the mesh axes
// tp_dep (h), tp_row (i) and tp_col (j): d stacked q x q SUMMA grids, each running its own batch rows.
#pragma once

#include "core/parallel/tensor/layout.h"
#include "core/parallel/tensor/linear_1d.h"

namespace kuafu::parallel {

// ---- Activation layout -------------------------------------------------------------------------
// An activation X [B, ..., H] is cut into d q batch-row blocks and q feature blocks. Rank (h, i, j)
// holds
//   X_hij = X[batch rows block h q + i, ..., features block j]        [B/(dq), ..., H/q]
// i.e. dim 0 is split over {tp_dep, tp_row} (tp_dep outermost, as in the mesh) and the last dim over
// tp_col. Within one depth layer h this is exactly the 2D activation layout of that layer's batch
// rows, so every 2.5D layer is the 2D layer run on d grids at once. Nothing is replicated: the loss
// is the sum over the ranks of each rank's loss on its own blocks. Token ids and targets [B, ...] are
// split by batch rows only (block h q + i, replicated over tp_col).
//
// The grid side q and the depth d; kuafu::Error unless the mesh has axes tp_dep, tp_row and tp_col
// with tp_row = tp_col.
int grid_side_2p5d(const dist::ProcessMesh& mesh);
int depth_2p5d(const dist::ProcessMesh& mesh);
Layout activation_layout_2p5d(int64_t dims);  // {{0, {tp_dep, tp_row}}, {dims - 1, {tp_col}}}
Layout batch_layout_2p5d();                   // {{0, {tp_dep, tp_row}}}: ids, targets
// This rank's block of a full activation (kuafu::Error when B is not divisible by d q, or H by q),
// and the full activation from every rank's block (collective over all d q^2 ranks).
torch::Tensor split_activation_2p5d(const torch::Tensor& full, const dist::ProcessMesh& mesh);
torch::Tensor gather_activation_2p5d(const torch::Tensor& block, const dist::ProcessMesh& mesh);

// ---- Linear ------------------------------------------------------------------------------------
// Y = X A + b. A [in, out] is cut into q x q blocks exactly as in 2D and REPLICATED over tp_dep:
//   A_ij = A[in block i, out block j]   [in/q, out/q]   Layout {{in_dim, {tp_row}}, {out_dim, {tp_col}}}
//   b_j  = b[out block j]               [out/q]         replicated over tp_row and tp_dep
// Forward, per depth layer h: SUMMA on that layer's grid (groups tp_row and tp_col, which stay inside
// the layer), Y_hij = Σ_k X_hik A_kj + b_j. Backward: dX as in 2D, within the layer; the layer's
// weight gradient Σ_i X_hik^T dY_hij covers only its own batch rows, so dA_kj is all-reduced over
// tp_dep; db_j is summed over tp_row and tp_dep (one all-reduce over both). Every depth layer then
// holds the full-batch gradient of its block, and the replicas stay equal under any optimizer.
// Traffic per rank and call: that of Linear2d plus one all-reduce of an A block (and of b_j).
// Spec: in and out divisible by q; stride must be 1.
class Linear2p5dImpl : public torch::nn::Module, public ShardedModule {
 public:
  Linear2p5dImpl(const LinearSpec& spec, const dist::ProcessMesh& mesh);
  torch::Tensor forward(const torch::Tensor& x);  // [B/(dq), ..., in/q] -> [B/(dq), ..., out/q]
  std::map<std::string, Layout> parameter_layouts() const override;

  torch::Tensor weight;  // [in/q, out/q] (kInOut) or [out/q, in/q] (kOutIn)
  torch::Tensor bias;    // [out/q] (undefined without bias)

 private:
  LinearSpec spec_;
  dist::GroupPtr row_group_;        // ranks (h, i, ·): this rank's grid row, along tp_col; group rank = j
  dist::GroupPtr col_group_;        // ranks (h, ·, j): this rank's grid column, along tp_row; group rank = i
  dist::GroupPtr depth_group_;      // ranks (·, i, j): the replicas of A_ij, along tp_dep
  dist::GroupPtr replicas_group_;   // ranks (·, ·, j): the replicas of b_j, along tp_dep and tp_row
};
TORCH_MODULE(Linear2p5d);

// ---- LayerNorm ---------------------------------------------------------------------------------
// LayerNorm over the full hidden size H while rank (h, i, j) holds features block j: the statistics
// are all-reduced along the grid row (tp_col), as in LayerNorm2d. γ_j, β_j are features block j,
// replicated over tp_row and tp_dep; their gradients are summed over both.
class LayerNorm2p5dImpl : public torch::nn::Module, public ShardedModule {
 public:
  LayerNorm2p5dImpl(int64_t hidden, const dist::ProcessMesh& mesh, double eps = 1e-5);
  torch::Tensor forward(const torch::Tensor& x);  // [B/(dq), ..., H/q] -> same
  std::map<std::string, Layout> parameter_layouts() const override;

  torch::Tensor weight;  // γ [H/q], ones
  torch::Tensor bias;    // β [H/q], zeros

 private:
  double eps_;
  dist::GroupPtr row_group_;       // along tp_col
  dist::GroupPtr replicas_group_;  // along tp_dep and tp_row
};
TORCH_MODULE(LayerNorm2p5d);

}  // namespace kuafu::parallel
