// 3D tensor parallelism (Agarwal's 3D matrix product, Colossal-AI's "3d" mode): P = q x q x q ranks on
// the mesh axes tp_x (a), tp_y (b), tp_z (c); each rank talks to q peers along one axis at a time.
#pragma once

#include "core/parallel/tensor/embedding.h"
#include "core/parallel/tensor/linear_1d.h"

namespace kuafu::parallel {

// ---- Activation layouts ------------------------------------------------------------------------
// An activation X [B, ..., H] is cut into q^3 blocks: the features into q blocks over one of tp_x /
// tp_y, its feature axis F; the batch into q^2 row blocks over the other one, its batch axis G, and
// tp_z (G outermost: parallel::Layout numbers blocks in mesh order). Row block (g, c) is rows
// [(g q + c) B/q^2, (g q + c + 1) B/q^2). The two sides:
//   F = tp_y (Side3d::kY, the model's input side): rank (a, b, c) holds
//       X[batch rows block (a, c), ..., features block b]     Layout {{0, {tp_x, tp_z}}, {-1, {tp_y}}}
//   F = tp_x (Side3d::kX): rank (a, b, c) holds
//       X[batch rows block (b, c), ..., features block a]     Layout {{0, {tp_y, tp_z}}, {-1, {tp_x}}}
// (-1: the last dim.) Every block is [B/q^2, ..., H/q]. A Linear3d turns one side into the other (see
// below); a pair of them, e.g. an MLP, returns to the side it started from, so residual adds line
// up. Element-wise functions (gelu, residual adds) apply to the blocks as they are. Nothing is
// replicated: the loss is the sum over the ranks of each rank's loss on its own blocks, and the
// gradient of a block lives on the rank that holds it.
enum class Side3d { kY, kX };
Side3d other_side(Side3d side);

// The cube side q; kuafu::Error unless the mesh has axes tp_x, tp_y and tp_z of one size.
int cube_side_3d(const dist::ProcessMesh& mesh);
Layout activation_layout_3d(int64_t dims, Side3d side);
// This rank's block of a full activation, and the full activation from every rank's block
// (collective over the cube).
torch::Tensor split_activation_3d(const torch::Tensor& full, const dist::ProcessMesh& mesh, Side3d side = Side3d::kY);
torch::Tensor gather_activation_3d(const torch::Tensor& block, const dist::ProcessMesh& mesh,
                                   Side3d side = Side3d::kY);

// ---- Linear ------------------------------------------------------------------------------------
// Y = X A + b with X [B, in] (leading dims flattened into B for the maths), A [in, out]. Name the
// three axes by their role in a layer whose input is on side F:
//   K = F      splits the input features: the contraction index k,
//   J = G      the input's batch axis; splits the output features: index j,
//   I = tp_z   splits the batch (index i) and, inside a weight block, the input features.
// Let R_i = the row blocks (m q + i) of q^2 for m = 0 .. q-1, in that order (B/q rows, strided), and
//   X_{i,k} = X[R_i, in block k of q],  A_{k,j} = A[in block k of q, out block j of q],
//   Y_{i,j} = X[R_i] A[:, out block j] = Σ_k X_{i,k} A_{k,j}.
// Rank with coordinates (i, j, k) along (I, J, K) stores
//   X block = X[row block (j, i), in block k]    [B/q^2, in/q]    (input on side F)
//   A block = A_{k,j}[in part i of q]            [in/q^2, out/q]  Layout {{in_dim, {K, tp_z}}, {out_dim, {J}}}
//   b block = b[out block j]                     [out/q]          Layout {{0, {J}}}: replicated over I, K
//   Y block = Y[row block (k, i), out block j]   [B/q^2, out/q]   (output on side J, the other side)
// Forward:
//   X_{i,k} = all_gather_J(X block)   along rows: the blocks (j, i), j = 0 .. q-1, are R_i
//   A_{k,j} = all_gather_I(A block)   along input features
//   P       = X_{i,k} A_{k,j}         local product: the k-th term of Y_{i,j}       [B/q, out/q]
//   Y block = reduce_scatter_K(P) + b_j   Σ_k along the K line; part k of R_i is row block (k, i)
// Backward, from dY block:
//   dY_{i,j} = all_gather_K(dY block)
//   dX block = reduce_scatter_J(dY_{i,j} A_{k,j}^T)    Σ_j, rank j keeps row block (j, i)
//   dA block = reduce_scatter_I(X_{i,k}^T dY_{i,j})    Σ_i, rank i keeps input part i
//   db_j     = Σ_rows dY block, all-reduced over I and K (the ranks holding the other rows of out block j)
// X_{i,k} and A_{k,j} are gathered again in backward rather than kept, so memory stays one block.
// Each collective runs over the q ranks of one axis line: O(q) = O(P^(1/3)) peers per rank.
// With stride s the output features are s segments (q|k|v) each cut into q blocks over J, so a fused
// q|k|v projection gives each rank whole heads.
// Spec: in divisible by q^2, out (per stride segment) by q; the batch (dim 0) by q^2.
class Linear3dImpl : public torch::nn::Module, public ShardedModule {
 public:
  Linear3dImpl(const LinearSpec& spec, const dist::ProcessMesh& mesh, Side3d input_side = Side3d::kY);
  torch::Tensor forward(const torch::Tensor& x);  // [B/q^2, ..., in/q] side F -> [B/q^2, ..., out/q] other side
  std::map<std::string, Layout> parameter_layouts() const override;
  Side3d input_side() const { return input_side_; }
  Side3d output_side() const { return other_side(input_side_); }

  torch::Tensor weight;  // [in/q^2, out/q] (kInOut) or [out/q, in/q^2] (kOutIn)
  torch::Tensor bias;    // [out/q] (undefined without bias)

 private:
  LinearSpec spec_;
  Side3d input_side_;
  dist::GroupPtr i_group_;   // along tp_z; group rank i
  dist::GroupPtr j_group_;   // along J; group rank j
  dist::GroupPtr k_group_;   // along K; group rank k
  dist::GroupPtr ik_group_;  // along tp_z and K: the replicas of b_j
};
TORCH_MODULE(Linear3d);

// ---- LayerNorm ---------------------------------------------------------------------------------
// LayerNorm over the full hidden size H of an activation on side F (features block f along F):
//   μ = (1/H) Σ_f Σ_{h ∈ block f} x_h,   σ² = (1/H) Σ_f Σ_{h ∈ block f} (x_h - μ)²   (all-reduced along F)
//   y = (x - μ) / sqrt(σ² + ε) ⊙ γ_f + β_f
// γ_f, β_f = features block f [H/q], Layout {{0, {F}}}, replicated over the batch axes G and tp_z;
// their gradients are summed over those two axes. Same side in and out.
class LayerNorm3dImpl : public torch::nn::Module, public ShardedModule {
 public:
  LayerNorm3dImpl(int64_t hidden, const dist::ProcessMesh& mesh, Side3d side = Side3d::kY, double eps = 1e-5);
  torch::Tensor forward(const torch::Tensor& x);  // [B/q^2, ..., H/q] -> same
  std::map<std::string, Layout> parameter_layouts() const override;

  torch::Tensor weight;  // γ [H/q], ones
  torch::Tensor bias;    // β [H/q], zeros

 private:
  double eps_;
  Side3d side_;
  dist::GroupPtr feature_group_;  // along F
  dist::GroupPtr replica_group_;  // along G and tp_z
};
TORCH_MODULE(LayerNorm3d);

// ---- Token embedding and the tied output layer -------------------------------------------------
// E [V, H] is stored as the weight of the output layer logits = X E^T, a Linear3d from side kY with
// E as its [out, in] weight: vocabulary block a over tp_x, features block (b, c) of q^2 over tp_y, tp_z:
//   E block = E[vocabulary block a, features block (b, c)]   [V/q, H/q^2]
//   Layout {{0, {tp_x}}, {1, {tp_y, tp_z}}}
// Lookup into side kY (rank (a, b, c): batch rows block (a, c), features block b): the features are
// gathered over tp_z and the vocabulary over tp_x, E[:, features block b] [V, H/q], and the rank looks
// up its rows' ids. Backward: the two gathers' reduce-scatters sum the contributions of the q^2 ranks
// holding features block b and leave each rank its block.
// Logits: Linear3d's product (Matmul3d) from side kY: rank (a, b, c) gets logits block [B/q^2, ..., V/q]
// on side kX, batch rows block (b, c), vocabulary block a.
// Cross-entropy: along tp_x the vocabulary-parallel cross-entropy of the rows (b, c); the q^2 row means
// are averaged over tp_y and tp_z.
class Embedding3dImpl : public TokenEmbeddingImpl, public ShardedModule {
 public:
  Embedding3dImpl(int64_t vocab, int64_t hidden, const dist::ProcessMesh& mesh);
  torch::Tensor forward(const torch::Tensor& ids) override;      // [B, ...] -> [B/q^2, ..., H/q] side kY
  torch::Tensor logits(const torch::Tensor& hidden) override;  // side kY -> [B/q^2, ..., V/q] side kX
  torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) override;
  torch::Tensor gather_logits(const torch::Tensor& logits) override;
  std::map<std::string, Layout> parameter_layouts() const override;

  torch::Tensor weight;  // [V/q, H/q^2]

 private:
  dist::GroupPtr x_group_, y_group_, z_group_;
  dist::GroupPtr input_rows_;   // along tp_x and tp_z: the row blocks of side kY (group rank a q + c)
  dist::GroupPtr output_rows_;  // along tp_y and tp_z: the row blocks of side kX (group rank b q + c)
};
TORCH_MODULE(Embedding3d);

}  // namespace kuafu::parallel
