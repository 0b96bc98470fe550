// AlphaFold 2's Evoformer modules (supplement 1.6, Algorithms 7-12 and 14-15), maths only. Shapes: the MSA
// stream m [S, R, c_m], the pair stream z [R, R, c_z], masks [S, R] and [R, R] (1 real, 0 padding). Each
// module returns its update (the block adds it: the residual and dropout are the block's). Parameter
// names follow AlphaFold's (module paths with '.' where its .npz keys have '/' and '//'), so a
// params_model_*.npz maps onto them one to one (load_alphafold_parameters).
//
// Under dynamic axial parallelism (a `layout` across a DAP group) each module's stream arrives with one axis
// cut (R' or S' of the whole: this rank's block) and its masks whole; each says which axis. Serially R' = R.
#pragma once

#include <string>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "core/io/npz.h"
#include "core/nn/gated_attention.h"
#include "core/parallel/dap/axial_layout.h"

namespace kuafu::fold {

namespace dap = parallel::dap;

// How AlphaFold initialises a Linear (common_modules.Linear's initializers, zero_init as DeepMind trains):
// kLinear LeCun truncated normal, kRelu He truncated normal, kFinal zero (a residual branch starts
// closed), kGating zero weights and bias 1 (a gate starts open).
enum class AfInit { kLinear, kRelu, kFinal, kGating };

// Haiku's Linear: weights [in, out], bias [out]; x [*, in] -> [*, out]. Zero until initialize().
struct AfLinearImpl : torch::nn::Module {
  AfLinearImpl(int64_t in, int64_t out, AfInit init = AfInit::kLinear, bool bias = true);
  // Its parameters made on `device` (torch::kMeta: described only, for lazy construction).
  AfLinearImpl(int64_t in, int64_t out, const torch::Device& device, AfInit init = AfInit::kLinear, bool bias = true);
  torch::Tensor forward(const torch::Tensor& x);
  // Its initial value of parameter `name` ("weights" or "bias") by `init`, into `value` (its shape), from
  // torch's default generator.
  void initial_value(const std::string& name, torch::Tensor& value) const;
  torch::Tensor weights, bias;
  AfInit init;
};
TORCH_MODULE(AfLinear);

// Haiku's LayerNorm over the last axis (eps 1e-5): scale, offset [c].
struct AfLayerNormImpl : torch::nn::Module {
  explicit AfLayerNormImpl(int64_t channels, const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor scale, offset;
};
TORCH_MODULE(AfLayerNorm);

// Algorithm 7 (per_row) with the pair bias, and Algorithm 8 (per_column) without it: gated
// self-attention along the MSA's rows (over residues) or its columns (over sequences).
struct MsaAttentionImpl : torch::nn::Module {
  MsaAttentionImpl(int64_t c_m, int64_t c_z, int64_t heads, bool per_column, const torch::Device& device = torch::kCPU);
  // m [S, R, c_m], mask [S, R], z [R, R, c_z] (row attention's pair bias). `chunk`: rows attended at a time.
  // Under `layout`: rows: m [S', R, c_m], z [R', R, c_z]; columns: m [S, R', c_m].
  torch::Tensor forward(const torch::Tensor& m, const torch::Tensor& mask, const torch::Tensor& z = {}, int64_t chunk = 0,
                        const dap::AxialLayout& layout = {});
  bool per_column;
  AfLayerNorm query_norm{nullptr}, feat_2d_norm{nullptr};
  torch::Tensor feat_2d_weights;  // [c_z, H]
  nn::GatedAttention attention{nullptr};
};
TORCH_MODULE(MsaAttention);

// Algorithm 19, the extra MSA stack's column attention: per residue, one query (the masked mean over
// sequences) per head against one shared key and value projection, gated per sequence. m [S, R, c],
// mask [S, R] -> [S, R, c] (under `layout` m [S, R', c] -> [S, R', c]).
struct MsaColumnGlobalAttentionImpl : torch::nn::Module {
  MsaColumnGlobalAttentionImpl(int64_t channels, int64_t heads, const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& m, const torch::Tensor& mask, const dap::AxialLayout& layout = {});
  AfLayerNorm query_norm{nullptr};
  std::shared_ptr<torch::nn::Module> attention;  // its parameters, under AlphaFold's "attention" scope
  torch::Tensor query_w, key_w, value_w, gating_w, gating_b, output_w, output_b;
  int64_t heads;
};
TORCH_MODULE(MsaColumnGlobalAttention);

// Algorithms 9 and 15: LayerNorm, Linear to factor × c with ReLU, Linear back. x [*, c] -> [*, c];
// `chunk` > 0: that many entries of the first axis at a time (inference: the hidden layer is 4× wider).
struct TransitionImpl : torch::nn::Module {
  TransitionImpl(int64_t channels, int64_t factor, const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& x, int64_t chunk = 0);
  AfLayerNorm input_layer_norm{nullptr};
  AfLinear transition1{nullptr}, transition2{nullptr};
};
TORCH_MODULE(Transition);

// Algorithm 10: the mean over sequences of the outer products of two projections of each residue's
// column, projected to c_z. m [S, R, c_m], mask [S, R] -> [R, R, c_z]. `chunk` > 0: that many rows i of the
// [R, R, c', c'] outer products at a time. Under `layout`: m [S, R', c_m] -> [R', R, c_z].
struct OuterProductMeanImpl : torch::nn::Module {
  OuterProductMeanImpl(int64_t c_m, int64_t c_z, int64_t c_outer, const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& m, const torch::Tensor& mask, int64_t chunk = 0, const dap::AxialLayout& layout = {});
  AfLayerNorm layer_norm_input{nullptr};
  AfLinear left_projection{nullptr}, right_projection{nullptr};
  torch::Tensor output_w, output_b;  // [c', c', c_z], [c_z]
};
TORCH_MODULE(OuterProductMean);

// Algorithms 11 (outgoing: edges ik and jk) and 12 (incoming: ki and kj), DeepMind's unfused weights.
// z [R, R, c_z], mask [R, R] -> [R, R, c_z]; `chunk` > 0: that many rows of the update at a time. Under
// `layout`: outgoing z [R', R, c_z], incoming z [R, R', c_z] (rows, columns cut), the output cut alike.
struct TriangleMultiplicationImpl : torch::nn::Module {
  TriangleMultiplicationImpl(int64_t c_z, int64_t c_hidden, bool outgoing, const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& z, const torch::Tensor& mask, int64_t chunk = 0, const dap::AxialLayout& layout = {});
  bool outgoing;
  AfLayerNorm layer_norm_input{nullptr}, center_layer_norm{nullptr};
  AfLinear left_projection{nullptr}, right_projection{nullptr}, left_gate{nullptr}, right_gate{nullptr};
  AfLinear output_projection{nullptr}, gating_linear{nullptr};
};
TORCH_MODULE(TriangleMultiplication);

// Algorithms 13 (starting node: each row attends along itself) and 14 (ending node: along columns),
// biased by the pair itself. z [R, R, c_z], mask [R, R] -> [R, R, c_z]; `chunk`: rows at a time. Under
// `layout`: starting node z [R', R, c_z], ending node z [R, R', c_z], the output cut alike.
struct TriangleAttentionImpl : torch::nn::Module {
  TriangleAttentionImpl(int64_t c_z, int64_t heads, bool ending_node, const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& z, const torch::Tensor& mask, int64_t chunk = 0, const dap::AxialLayout& layout = {});
  bool ending_node;
  AfLayerNorm query_norm{nullptr};
  torch::Tensor feat_2d_weights;  // [c_z, H]
  nn::GatedAttention attention{nullptr};
};
TORCH_MODULE(TriangleAttention);

// Sizes of an Evoformer block (Algorithm 6) or an extra-MSA block (Algorithm 18's iteration).
struct EvoformerSizes {
  int64_t msa_channels = 256;    // c_m (extra MSA: c_e = 64)
  int64_t pair_channels = 128;   // c_z
  int64_t msa_heads = 8;         // row and column attention
  int64_t pair_heads = 4;        // triangle attention
  int64_t outer_channels = 32;   // outer product mean's c
  int64_t triangle_channels = 128;  // triangle multiplication's c
  int64_t transition_factor = 4;
  bool global_column_attention = false;  // the extra MSA stack's
};

// One Evoformer iteration: the MSA stack (row attention with the pair bias, column attention, transition),
// the outer product mean into the pair, then the pair stack; every update added to its stream (no
// dropout: training's dropout is the trainer's to add). m [S, R, c_m], z [R, R, c_z].
struct EvoformerBlockImpl : torch::nn::Module {
  explicit EvoformerBlockImpl(const EvoformerSizes& sizes, const torch::Device& device = torch::kCPU);
  // -> (m, z) updated. `chunk` > 0: attention rows, transition entries, outer-product and triangle
  // multiplication rows at a time
  // (inference at lengths whose whole intermediates would not fit; the same result). Under `layout`, m
  // [S', R, c_m] and z [R', R, c_z] in and out (each rank's rows); the masks whole.
  std::pair<torch::Tensor, torch::Tensor> forward(torch::Tensor m, torch::Tensor z, const torch::Tensor& msa_mask,
                                                  const torch::Tensor& pair_mask, int64_t chunk = 0,
                                                  const dap::AxialLayout& layout = {});
  MsaAttention msa_row_attention_with_pair_bias{nullptr}, msa_column_attention{nullptr};
  MsaColumnGlobalAttention msa_column_global_attention{nullptr};
  Transition msa_transition{nullptr}, pair_transition{nullptr};
  OuterProductMean outer_product_mean{nullptr};
  TriangleMultiplication triangle_multiplication_outgoing{nullptr}, triangle_multiplication_incoming{nullptr};
  TriangleAttention triangle_attention_starting_node{nullptr}, triangle_attention_ending_node{nullptr};
};
TORCH_MODULE(EvoformerBlock);

// The elements each rank sends in one block's forward under DAP over `parts` ranks, for `rows` MSA rows and
// `residues` residues (both dividing by parts): the gathered pair biases (row attention, both triangle
// attentions), the triangle multiplications' gathered projections and the outer product's, and the two moves
// of m and four of z. Its backward sends as many (each collective's inverse).
int64_t dap_block_sent_elements(const EvoformerSizes& sizes, int64_t rows, int64_t residues, int64_t parts);

// AlphaFold's initial values for every parameter under `root` (each AfLinear by its kind, LayerNorms at
// 1 and 0, attention as GatedAttention::initialize, the pair-bias projections normal with σ = 1/√c_z, IPA's
// point weights at softplus⁻¹(1), the rest zero), drawn from torch's default CPU generator in parameter
// order (seed it first), wherever the parameters live; a model described on the meta device hands them to
// the WeightSink in scope.
void initialize_alphafold_weights(torch::nn::Module& root);

// The .npz key of a module's parameter: "<module path>[/<scope>]//<name>" for the torch name "[scope.]name"
// ("attention.query_w" under ".../msa_transition" -> ".../msa_transition/attention//query_w").
std::string alphafold_key(const std::string& module_path, const std::string& parameter);

// Copies the arrays of `params` under `prefix` (e.g. "alphafold/alphafold_iteration/evoformer/
// evoformer_iteration/msa_transition") into `module`'s parameters of the same names; `block` >= 0 takes
// that slice of a stacked block array. kuafu::Error naming the key for a missing array or a shape that
// differs; every parameter of `module` must be given.
void load_alphafold_parameters(torch::nn::Module& module, const io::NpzArrays& params, const std::string& prefix, int64_t block = -1);

}  // namespace kuafu::fold
