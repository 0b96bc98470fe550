// AlphaFold 2's structure module (supplement 1.8, Algorithm 20), maths only. Shapes: the single
// representation s [R, c_s], the pair z [R, R, c_z], each residue's frame (Rigid, [R]); L layers.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "apps/fastfold/evoformer.h"
#include "apps/fastfold/residue_geometry.h"
#include "apps/fastfold/rigid.h"

namespace kuafu::fold {

struct IpaSizes {
  int64_t single_channels = 384;  // c_s (AlphaFold's num_channel)
  int64_t pair_channels = 128;    // c_z
  int64_t heads = 12;
  int64_t scalar_qk = 16, scalar_v = 16;  // per head
  int64_t point_qk = 4, point_v = 8;      // per head
};

// Algorithm 22: attention whose logits add scalar q·k, the pair's bias and the (learned-weight) squared
// distances between query and key points placed in the global frame by each residue's frame, so the
// result is invariant to a global motion; outputs scalar values, points brought back into the query's
// frame and their norms, and the attention-weighted pair, projected to c_s.
struct InvariantPointAttentionImpl : torch::nn::Module {
  explicit InvariantPointAttentionImpl(const IpaSizes& sizes, const torch::Device& device = torch::kCPU);
  // s [R, c_s], z [R, R, c_z], frames [R], mask [R] -> [R, c_s]; queries in chunks of `chunk_size` rows
  // (0: all at once), the same result.
  torch::Tensor forward(const torch::Tensor& s, const torch::Tensor& z, const Rigid& frames, const torch::Tensor& mask,
                        int64_t chunk_size = 0);
  IpaSizes sizes;
  AfLinear q_scalar{nullptr}, kv_scalar{nullptr}, q_point_local{nullptr}, kv_point_local{nullptr};
  AfLinear attention_2d{nullptr}, output_projection{nullptr};
  torch::Tensor trainable_point_weights;  // [H], through softplus (initialize_alphafold_weights: softplus⁻¹(1))
};
TORCH_MODULE(InvariantPointAttention);

struct StructureModuleSizes {
  int64_t single_channels = 384;      // the Evoformer's single representation (AlphaFold's seq_channel)
  IpaSizes ipa;                       // ipa.single_channels: the module's own width (num_channel)
  int64_t layers = 8;                 // the fold iteration, its weights shared
  int64_t transition_layers = 3;
  int64_t angle_channels = 128;       // the torsion-angle ResNet (sidechain num_channel)
  int64_t angle_blocks = 2;
  double position_scale = 10.0;       // the frames' translations are in units of 10 Å inside
};

// Algorithm 20, lines 11-14: the torsion angles (ω, φ, ψ, χ1..χ4) from the current and the initial single
// representation, a small ResNet. -> unnormalised (sin, cos) [R, 7, 2].
struct AngleResnetImpl : torch::nn::Module {
  AngleResnetImpl(int64_t channels, int64_t initial_channels, int64_t hidden, int64_t blocks,
                  const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& s, const torch::Tensor& s_initial);
  AfLinear input_projection{nullptr}, input_projection_1{nullptr}, unnormalized_angles{nullptr};
  std::vector<std::pair<AfLinear, AfLinear>> blocks;  // resblock1, resblock2 (then _1, _2 ...)
};
TORCH_MODULE(AngleResnet);

// One fold iteration's weights (Algorithm 20, lines 6-14), applied `layers` times.
struct FoldIterationImpl : torch::nn::Module {
  explicit FoldIterationImpl(const StructureModuleSizes& sizes, const torch::Device& device = torch::kCPU);
  InvariantPointAttention invariant_point_attention{nullptr};
  AfLayerNorm attention_layer_norm{nullptr}, transition_layer_norm{nullptr};
  std::vector<AfLinear> transition;  // transition, transition_1, ...
  AfLinear affine_update{nullptr};
  AngleResnet rigid_sidechain{nullptr};
};
TORCH_MODULE(FoldIteration);

// What the structure module gives, each per layer on a leading axis [L, ...].
struct StructureOutputs {
  torch::Tensor single;           // [R, c]: the last layer's activations
  torch::Tensor quaternions;      // [L, R, 4]: the backbone rotations (w, x, y, z), unit
  torch::Tensor translations;     // [L, R, 3]: the backbone origins (CA), Å
  torch::Tensor unnormalized_angles, angles;  // [L, R, 7, 2]: (sin, cos), as predicted and normalised
  Rigid frames;                   // [L, R, 8]: every rigid group's frame, Å
  torch::Tensor atom14;           // [L, R, 14, 3] Å

  Rigid backbone(int64_t layer) const;  // [R] frames of a layer (-1: the last), Å
};

struct StructureModuleImpl : torch::nn::Module {
  explicit StructureModuleImpl(const StructureModuleSizes& sizes, const torch::Device& device = torch::kCPU);
  // s [R, c_s], z [R, R, c_z] (in s's dtype or another: a bf16 trunk's), aatype [R] int64, mask [R];
  // `geometry` in s's dtype and device. The pair's rows and the attention's queries go in chunks of
  // `chunk_size` (0: whole), the same result.
  StructureOutputs forward(const torch::Tensor& s, const torch::Tensor& z, const torch::Tensor& aatype,
                           const torch::Tensor& mask, const ResidueGeometry& geometry, int64_t chunk_size = 0);
  StructureModuleSizes sizes;
  AfLayerNorm single_layer_norm{nullptr}, pair_layer_norm{nullptr};
  AfLinear initial_projection{nullptr};
  FoldIteration fold_iteration{nullptr};
};
TORCH_MODULE(StructureModule);

}  // namespace kuafu::fold
