// AlphaFold 2's model (supplement Algorithm 2): the embedders, the extra-MSA stack, the Evoformer, the
// structure module and the heads, one recycling iteration at a time, with recycling around it. Maths only;
// parameters in DeepMind's layout (alphafold_parameters maps each to its params_model_*.npz key).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "apps/fastfold/embedders.h"
#include "apps/fastfold/evoformer.h"
#include "apps/fastfold/heads.h"
#include "apps/fastfold/residue_geometry.h"
#include "apps/fastfold/structure_module.h"
#include "apps/fastfold/structure_losses.h"
#include "core/hooks/block_model.h"
#include "core/parallel/tensor/factory.h"

namespace kuafu::fold {

struct AlphaFoldLoss;  // alphafold_losses.h

struct AlphaFoldSizes {
  int64_t msa_channels = 256;        // c_m
  int64_t pair_channels = 128;       // c_z
  int64_t single_channels = 384;     // c_s
  int64_t extra_msa_channels = 64;   // c_e
  int64_t evoformer_blocks = 48, extra_msa_blocks = 4;
  int64_t msa_heads = 8, pair_heads = 4;
  int64_t outer_channels = 32, triangle_channels = 128;
  int64_t max_relative = 32;
  StructureModuleSizes structure;    // single_channels and ipa.pair_channels follow c_s and c_z
  int64_t recycle_bins = 15;
  double recycle_min = 3.25, recycle_max = 20.75;  // Å
  int64_t distogram_bins = 64;
  double distogram_first = 2.3125, distogram_last = 21.6875;  // Å
  int64_t msa_classes = 23;
  int64_t plddt_bins = 50, plddt_channels = 128;
  // AlphaFold's fine-tuning stage adds the experimentally-resolved head (DeepMind's parameter files carry it);
  // initial training has none.
  bool experimentally_resolved_head = false;

  EvoformerSizes evoformer() const;
  EvoformerSizes extra_msa() const;
};

// One recycling iteration's inputs, named as AlphaFold's batch.
struct AlphaFoldFeatures {
  torch::Tensor aatype, residue_index;  // [R] int64
  torch::Tensor seq_mask;               // [R]
  torch::Tensor target_feat;            // [R, 22]
  torch::Tensor msa_feat, msa_mask;     // [S, R, 49], [S, R]
  torch::Tensor extra_msa;              // [E, R] int64
  torch::Tensor extra_has_deletion, extra_deletion_value, extra_msa_mask;  // [E, R]

  AlphaFoldFeatures to(const torch::TensorOptions& options) const;  // the floating features in its dtype
};

// What an iteration hands the next (no gradient): the first MSA row [R, c_m], the pair [R, R, c_z] and the
// predicted atoms [R, 37, 3].
struct Recycled {
  torch::Tensor msa_first_row, pair, positions;
  // pair_dtype: the pair's, when the trunk runs in another dtype than the outputs (bf16 inference).
  static Recycled zeros(int64_t residues, const AlphaFoldSizes& sizes, const torch::TensorOptions& options,
                        std::optional<torch::ScalarType> pair_dtype = std::nullopt);
};

struct AlphaFoldOutputs {
  torch::Tensor msa, pair, single;  // the Evoformer's representations [S, R, c_m], [R, R, c_z], [R, c_s]
  StructureOutputs structure;
  torch::Tensor atom37;             // [R, 37, 3] the last layer's atoms (0 where a type has none)
  torch::Tensor distogram_logits;   // [R, R, bins]
  torch::Tensor masked_msa_logits;  // [S, R, 23]
  torch::Tensor plddt_logits;       // [R, 50]
  torch::Tensor experimentally_resolved_logits;  // [R, 37], where the model has the head
  Recycled recycled() const;        // detached
  // The first `residues` residues of every output: a padded example's real ones.
  AlphaFoldOutputs first_residues(int64_t residues) const;
};

// The embedders and the two stacks under AlphaFold's "evoformer" scope.
struct EmbeddingsAndEvoformerImpl : torch::nn::Module {
  explicit EmbeddingsAndEvoformerImpl(const AlphaFoldSizes& sizes, const torch::Device& device = torch::kCPU);
  InputEmbedder input_embedder{nullptr};
  RecyclingEmbedder recycling_embedder{nullptr};
  AfLinear extra_msa_activations{nullptr}, single_activations{nullptr};
  torch::nn::ModuleList extra_msa_stack, evoformer_iteration;  // of EvoformerBlock
};
TORCH_MODULE(EmbeddingsAndEvoformer);

// A hooks::BlockModel: the head "embed" (the input and recycling embedders, the extra MSA's projection) turns a
// batch of named features (alphafold_batch.h) into the streams m, z and e; the blocks "extra_msa_stack.<i>" map
// {m, z, e} (the last of them hands on {m, z}), then "evoformer.<i>" map {m, z}; the tail "structure" (the
// single projection, the structure module and the heads) gives the outputs, their loss, or what the next
// recycling iteration reads. Strategies (activation checkpointing, ZeRO, Gemini) act on those parts.
struct AlphaFoldImpl : torch::nn::Module, hooks::BlockModel {
  // `options`: the device its parameters are made on (torch::kMeta: described only) and the DAP group its
  // blocks run over (`layout`); AlphaFold has no tensor-parallel layers.
  explicit AlphaFoldImpl(const AlphaFoldSizes& sizes, const parallel::ModelOptions& options = {});
  torch::nn::Module& module() override { return *this; }

  // One iteration (Algorithm 2, lines 5-21) from the previous one's outputs, through the block sites;
  // `geometry` in the features' dtype and device. `previous` is let go once embedded.
  AlphaFoldOutputs iteration(const AlphaFoldFeatures& features, Recycled previous, const ResidueGeometry& geometry);
  // Algorithm 2 with recycling: iteration i reads features[i]; every iteration but the last runs without
  // gradient, and each starts from the previous one's detached outputs (zeros before the first).
  AlphaFoldOutputs forward(const std::vector<AlphaFoldFeatures>& iterations, const ResidueGeometry& geometry);
  // The same from a batch of every iteration's features (alphafold_batch), with the model's own ideal residues.
  AlphaFoldOutputs forward(const hooks::Batch& batch);

  // hooks::BlockModel.
  int64_t num_blocks() const override { return sizes.extra_msa_blocks + sizes.evoformer_blocks; }
  hooks::ModelPart head_part() const override;
  hooks::ModelPart block_part(int64_t i) const override;
  hooks::ModelPart tail_part() const override;
  // recycled: {first MSA row [R, c_m], pair [R, R, c_z], atoms [R, 37, 3]} or empty (zeros) ->
  // {m [S', R, c_m], z [R', R, c_z], e [E', R, c_e]}, each this DAP rank's rows (e only with extra blocks).
  hooks::Tensors head_streams(const hooks::Batch& batch, const hooks::Tensors& recycled) override;
  hooks::Tensors block_streams(int64_t i, const hooks::Tensors& streams, const hooks::Batch& batch) override;
  // AlphaFold's training loss (loss_settings' weights) against the batch's labels.
  torch::Tensor tail_loss_streams(const hooks::Tensors& streams, const hooks::Batch& batch) override;
  // float64 [loss, 1 example, 0].
  torch::Tensor tail_sums_streams(const hooks::Tensors& streams, const hooks::Batch& batch) override;
  int64_t iterations(const hooks::Batch& batch) const override;
  hooks::Batch iteration_batch(const hooks::Batch& batch, int64_t i) const override;
  hooks::Tensors recycled_streams(const hooks::Tensors& final_streams, const hooks::Batch& batch) override;
  // The final streams {m, z} -> the iteration's outputs (the structure module and heads on the whole
  // streams); `geometry` in the streams' dtype and device.
  AlphaFoldOutputs outputs(const hooks::Tensors& streams, const hooks::Batch& batch, const ResidueGeometry& geometry);
  // The dtype of the trunk (embedders, both stacks) and of the outputs (structure module, heads): the same
  // in training; predict may run the trunk in bf16 with the rest in float32 (precision.dtype = "bf16").
  torch::ScalarType trunk_dtype() const;
  torch::ScalarType output_dtype() const;
  // AlphaFold's loss of an iteration's outputs against the batch's labels, with `settings`' weights.
  AlphaFoldLoss training_loss(const AlphaFoldOutputs& out, const hooks::Batch& batch, const AlphaFoldLossSettings& settings);

  AlphaFoldSizes sizes;
  AlphaFoldLossSettings loss_settings;  // the training loss's weights
  // > 0: the Evoformer's and extra-MSA stack's attention, transitions and outer products, the structure
  // module's attention and the distogram this many rows at a time (the same result, less memory: inference at
  // long lengths).
  int64_t chunk_size = 0;
  // Where the extra-MSA stack's and the Evoformer's streams lie: serial, or cut across a DAP group (each
  // rank then runs every block on its rows; the MSA's rows, the extra rows and the residues must divide
  // by the group's size: pad_example).
  dap::AxialLayout layout;
  EmbeddingsAndEvoformer evoformer{nullptr};
  StructureModule structure_module{nullptr};
  DistogramHead distogram_head{nullptr};
  MaskedMsaHead masked_msa_head{nullptr};
  PlddtHead predicted_lddt_head{nullptr};
  ExperimentallyResolvedHead experimentally_resolved_head{nullptr};  // where sizes.experimentally_resolved_head

 private:
  // The ideal residues on `like`'s device in the outputs' dtype (made once per dtype and device).
  const ResidueGeometry& geometry_like(const torch::Tensor& like);
  // The outputs through the tail's site, from the final streams.
  AlphaFoldOutputs tail_outputs(const hooks::Tensors& streams, const hooks::Batch& batch, const ResidueGeometry& geometry);
  ResidueGeometry geometry_;
};
TORCH_MODULE(AlphaFold);

// Each parameter with its params_model_*.npz key and, for a stacked block's, the block's index (else -1).
struct AlphaFoldParameter {
  std::string name;  // in the model
  torch::Tensor tensor;
  std::string key;
  int64_t block = -1;
};
std::vector<AlphaFoldParameter> alphafold_parameters(AlphaFoldImpl& model);

// Reads a params_model_*.npz's arrays into the model, or into the WeightSink in scope for a model described on
// the meta device (kuafu::Error naming the key for a missing array or a shape that differs; arrays the model
// does not use are ignored: unused_alphafold_arrays names them).
void load_alphafold(AlphaFoldImpl& model, const io::NpzArrays& params);
// The keys of `params` that no parameter of the model reads (a head it was not made with), sorted.
std::vector<std::string> unused_alphafold_arrays(AlphaFoldImpl& model, const io::NpzArrays& params);
// The model's parameters in params_model_*.npz's layout (blocks stacked), float32.
io::NpzArrays alphafold_arrays(AlphaFoldImpl& model);

}  // namespace kuafu::fold
