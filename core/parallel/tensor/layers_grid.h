// 2D (SUMMA) and 2.5D (Tesseract) tensor parallelism, Colossal-AI's "2d" and "2.5d" modes. The ranks
// form d stacked q x q grids on the mesh axes tp_dep (h), tp_row (i) and tp_col (j), P = d q^2; each
// grid runs its own batch rows. 2D is the case d = 1, whose mesh has no tp_dep axis: every layer here
// serves both modes. Weights and activations are cut into q x q blocks, so no rank holds either whole.
#pragma once

#include "core/parallel/tensor/embedding.h"
#include "core/parallel/tensor/linear_1d.h"

namespace kuafu::parallel {

// ---- Activation layout -------------------------------------------------------------------------
// An activation X [B, ..., H] is cut into d q batch-row blocks and q feature blocks. Rank (h, i, j)
// holds
//   X_hij = X[batch rows block h q + i, ..., features block j]        [B/(dq), ..., H/q]
// i.e. dim 0 is split over {tp_dep, tp_row} (tp_dep outermost, as in the mesh; tp_row alone in 2D)
// and the last dim over tp_col. Every layer takes and returns this layout, so element-wise functions
// (gelu, residual adds) apply to the blocks as they are. Nothing is replicated: the loss is the sum
// over the ranks of each rank's loss on its own blocks (or one value counted once, like the
// cross-entropy's), and the gradient of a block lives on the rank that holds it. Token ids and
// targets [B, ...] are split by batch rows only (block h q + i, replicated over tp_col).
struct GridShape {
  int q = 1;               // grid side
  int d = 1;               // depth: stacked grids (1 in 2D)
  bool has_depth = false;  // the mesh has a tp_dep axis (2.5D)
  std::vector<std::string> row_axes() const;  // {tp_dep, tp_row} or {tp_row}: the axes cutting the batch
};
// kuafu::Error unless the mesh has axes tp_row and tp_col of equal size (and perhaps tp_dep).
GridShape grid_shape(const dist::ProcessMesh& mesh);
Layout grid_activation_layout(int64_t dims, const dist::ProcessMesh& mesh);
Layout grid_batch_layout(const dist::ProcessMesh& mesh);  // ids, targets
// This rank's block of a full activation (kuafu::Error when B does not divide by d q, or H by q), and
// the full activation from every rank's block (collective over all d q^2 ranks).
torch::Tensor split_activation_grid(const torch::Tensor& full, const dist::ProcessMesh& mesh);
torch::Tensor gather_activation_grid(const torch::Tensor& block, const dist::ProcessMesh& mesh);

// ---- Linear ------------------------------------------------------------------------------------
// Y = X A + b by SUMMA on each grid. A [in, out] is cut like an activation, b by output features,
// both replicated over tp_dep:
//   A_ij = A[in block i, out block j]   [in/q, out/q]   Layout {{in_dim, {tp_row}}, {out_dim, {tp_col}}}
//   b_j  = b[out block j]               [out/q]         replicated over tp_row (and tp_dep)
// With stride s the output features are s segments (q|k|v) each cut into q blocks, and out block j is
// the j-th block of every segment, so a fused q|k|v projection gives each rank whole heads.
// Rank (h, i, j) builds its output block from q block products:
//   Y_hij = Σ_k X_hik A_kj + b_j
// at step k, rank (h, i, k) broadcasts X_hik along grid row i and rank (h, k, j) broadcasts A_kj along
// grid column j. Backward, from dY_hij:
//   dX_hik = Σ_j dY_hij A_kj^T   every rank of row i computes its term; reduced to rank (h, i, k)
//   dA_kj  = Σ_h Σ_i X_hik^T dY_hij   reduced down column j to rank (h, k, j), then all-reduced over
//                                     tp_dep: each grid saw only its own batch rows
//   db_j   = Σ_rows dY_hij   all-reduced over tp_row and tp_dep
// Every grid then holds the full-batch gradient of its blocks, and the replicas stay equal.
// Traffic per rank and call: forward q broadcasts of an X block and q of an A block; backward the
// same broadcasts again (the received blocks are not kept, so memory stays one block, not q), q
// reductions of each gradient block, and in 2.5D one all-reduce of an A block over the depth.
// Spec: in and out (per stride segment) divisible by q.
class GridLinearImpl : public torch::nn::Module, public ShardedModule {
 public:
  GridLinearImpl(const LinearSpec& spec, const dist::ProcessMesh& mesh);
  torch::Tensor forward(const torch::Tensor& x);  // [B/(dq), ..., in/q] -> [B/(dq), ..., out/q]
  std::map<std::string, Layout> parameter_layouts() const override;

  torch::Tensor weight;  // [in/q, out/q] (kInOut) or [out/q, in/q] (kOutIn)
  torch::Tensor bias;    // [out/q] (undefined without bias)

 private:
  LinearSpec spec_;
  dist::GroupPtr row_group_;       // ranks (h, i, ·): this rank's grid row, along tp_col; group rank = j
  dist::GroupPtr col_group_;       // ranks (h, ·, j): this rank's grid column, along tp_row; group rank = i
  dist::GroupPtr depth_group_;     // ranks (·, i, j): the replicas of A_ij along tp_dep (null in 2D)
  dist::GroupPtr replicas_group_;  // ranks (·, ·, j): the replicas of b_j, along tp_dep and tp_row
};
TORCH_MODULE(GridLinear);

// ---- LayerNorm ---------------------------------------------------------------------------------
// LayerNorm over the full hidden size H while rank (h, i, j) holds features block j [.., H/q]:
//   μ  = (1/H) Σ_j Σ_{h ∈ block j} x_h          σ² = (1/H) Σ_j Σ_{h ∈ block j} (x_h - μ)²
//   y_ij = (x_ij - μ) / sqrt(σ² + ε) ⊙ γ_j + β_j
// (both sums all-reduced along the grid row, two-pass as torch computes them). γ_j, β_j are features
// block j, replicated over tp_row and tp_dep; their gradients are summed over both. The
// normalisation's backward is written out in summa.h (one all-reduce along the row).
class GridLayerNormImpl : public torch::nn::Module, public ShardedModule {
 public:
  GridLayerNormImpl(int64_t hidden, const dist::ProcessMesh& mesh, double eps = 1e-5);
  torch::Tensor forward(const torch::Tensor& x);  // [B/(dq), ..., H/q] -> same
  std::map<std::string, Layout> parameter_layouts() const override;

  torch::Tensor weight;  // γ [H/q], ones
  torch::Tensor bias;    // β [H/q], zeros

 private:
  double eps_;
  bool has_depth_ = false;
  dist::GroupPtr row_group_;       // along tp_col
  dist::GroupPtr replicas_group_;  // along tp_dep and tp_row
};
TORCH_MODULE(GridLayerNorm);

// ---- Token embedding and the tied output layer -------------------------------------------------
// E [V, H] cut like a weight, E_ij = E[vocabulary block i, features block j] [V/q, H/q], replicated
// over tp_dep.
// Lookup: the column's blocks are gathered, E_·j = [E_0j; ...; E_(q-1)j] [V, H/q] (all-gather along
// tp_row), and rank (h, i, j) looks up its batch rows' ids: X_hij = E_·j[ids_hi], the activation
// layout. Backward: each rank scatters its rows' gradients into [V, H/q]; the reduce-scatter along
// the column sums the grid rows' contributions and leaves block i on rank (h, i, j); the depth sums.
// Logits = X E^T by SUMMA with a transposed operand: the logits block of rank (h, i, l) is
//   Z_hil = Σ_j X_hij E_lj^T     [B/(dq), ..., V/q], vocabulary block l over tp_col
// at step l every rank (h, i, j) receives E_lj down its column and its term is reduced along row i
// to rank (h, i, l). Backward: dX_hij = Σ_l dZ_hil E_lj (dZ_hil broadcast along the row, E_lj down
// the column) and dE_lj = Σ_i dZ_hil^T X_hij (reduced down column j to rank (h, l, j), then summed
// over tp_dep). The logits are in the activation layout with the vocabulary as features.
// Cross-entropy: along each grid row the vocabulary-parallel cross-entropy of that row's tokens; the
// d q row means (equal token counts) are averaged over tp_row and tp_dep.
class GridEmbeddingImpl : public TokenEmbeddingImpl, public ShardedModule {
 public:
  GridEmbeddingImpl(int64_t vocab, int64_t hidden, const dist::ProcessMesh& mesh);
  torch::Tensor forward(const torch::Tensor& ids) override;  // [B, ...] -> [B/(dq), ..., H/q]
  torch::Tensor logits(const torch::Tensor& hidden) override;  // [B/(dq), ..., H/q] -> [B/(dq), ..., V/q]
  torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) override;
  torch::Tensor gather_logits(const torch::Tensor& logits) override;
  std::map<std::string, Layout> parameter_layouts() const override;

  torch::Tensor weight;  // [V/q, H/q]

 private:
  dist::GroupPtr row_group_;       // along tp_col; group rank j
  dist::GroupPtr col_group_;       // along tp_row; group rank i
  dist::GroupPtr depth_group_;     // along tp_dep (null in 2D)
  dist::GroupPtr replicas_group_;  // along tp_dep and tp_row; group rank h q + i, the row block
};
TORCH_MODULE(GridEmbedding);

// The grid cross-entropy on its own: logits in the activation layout ([B/(dq), ..., V/q], vocabulary
// block j) against this rank's targets [B/(dq), ...] (its batch rows, global ids).
torch::Tensor grid_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                 const dist::ProcessMesh& mesh);

}  // namespace kuafu::parallel
