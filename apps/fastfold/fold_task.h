// Protein structure training as the trainer sees it: each row of a step is a crop of a training chain in
// the epoch's order, its MSA features drawn from (seed, step, row) and its number of recycling iterations
// from (seed, step), so any rank computes the same row and a resumed run goes on exactly. Evaluation
// predicts each validation chain (its first data.eval_crop_size residues) with every recycling iteration and
// reports the loss, lDDT-Cα, TM-score, GDT-TS, Cα RMSD and how well pLDDT tracks the true lDDT.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "apps/fastfold/alphafold_model.h"
#include "apps/fastfold/fold_data.h"
#include "apps/fastfold/fold_settings.h"
#include "apps/fastfold/structure_metrics.h"
#include "apps/fastfold/violations.h"
#include "core/io/epoch_order.h"
#include "core/train/model_task.h"

namespace kuafu::fold {

// A chain predicted: the outputs of its last iteration, and its scores against the truth.
struct Prediction {
  AlphaFoldOutputs outputs;
  torch::Tensor plddt;        // [R] 0..100
  torch::Tensor true_lddt;    // [R] per-residue lDDT-Cα of the prediction, 0..1
  StructureScores scores;
  ViolationFractions violations;  // the residues whose atoms break bonds, angles or clash (1.9.11)
  double violation_loss = 0;      // their loss (equation 47), whatever the loss settings' weight
  double loss = 0;            // with a truth (else 0, as the scores)
};

// The loss of one example run on `device` (its outputs kept in `kept` when given).
AlphaFoldLoss example_loss(AlphaFoldImpl& model, const FoldExample& example, const FoldSettings& settings,
                           const torch::Device& device, AlphaFoldOutputs* kept = nullptr);

// The chain's prediction with `iterations` recycling iterations, no MSA masking, features drawn by `seed`;
// scored when the chain has a truth (at least 3 Cα).
Prediction predict_chain(AlphaFoldImpl& model, const FoldChain& chain, const FoldSettings& settings, int64_t iterations,
                         uint64_t seed, const torch::Device& device);

// The example as the model's batch (alphafold_batch.h): padded for the model's DAP group's cuts, its floating
// features and labels in the dtype of the model's outputs (float64 in the exactness tests), on `device`.
hooks::Batch example_batch(AlphaFoldImpl& model, const FoldExample& example, const torch::Device& device);
// The same in `dtype`: the run's compute dtype where the model is not cast to it yet (the benchmark builds its
// batch before the precision strategy casts the model).
hooks::Batch example_batch(AlphaFoldImpl& model, const FoldExample& example, const torch::Device& device, torch::Dtype dtype);

// The shared training path (train::ModelTask) over AlphaFold: each row a crop of its own (chains differ in
// length), run through the model's recycling iterations by ParallelModel; its own evaluation scores whole
// structures.
class FoldTask : public train::ModelTask {
 public:
  // `options`: what ParallelModel applies (activation checkpointing; kuafu-fold trains data parallel only).
  FoldTask(AlphaFold model, FoldSettings settings, std::vector<FoldChain> train, std::vector<FoldChain> val,
           int64_t batch_size, const torch::Device& device, const train::ParallelOptions& options = {});

  // Row `first_row` of step `step`'s global batch (rows = 1): a crop drawn from (seed, step, row).
  train::Batch train_batch(int64_t step, int64_t first_row, int64_t rows) override;
  // The validation chains, each its first data.eval_crop_size residues with every recycling iteration.
  int64_t eval_rows() const override { return static_cast<int64_t>(val_.size()); }
  train::Batch eval_batch(int64_t first_row, int64_t rows) override;
  train::LossSum evaluate(int rank, int ranks) override;
  std::vector<train::EvalMetric> eval_metrics(const train::LossSum& sums) const override;
  // A row's mean training FLOPs (alphafold_flops) over its items, so that items/s x this is FLOPs/s.
  double flops_per_item() const override { return flops_per_row_ / static_cast<double>(items_per_row()); }
  int64_t items_per_row() const override { return settings_.crop_size; }
  std::string item_name() const override { return "residues"; }
  int64_t steps_per_epoch() const override { return order_.steps_per_epoch(); }
  std::vector<std::string> checkpoint_keys() const override { return {"model.", "data.crop_size"}; }
  std::map<std::string, double> step_figures(int64_t step) override;

  AlphaFold& alphafold() { return model_; }
  const std::vector<FoldChain>& val_chains() const { return val_; }
  // Recycling iterations of step `step` (1 + a draw of 0..max_recycles from (seed, step)).
  int64_t iterations_of(int64_t step) const;

 private:
  uint64_t eval_seed(int64_t chain) const;  // validation chain `chain`'s MSA draws

  AlphaFold model_;
  FoldSettings settings_;
  std::vector<FoldChain> train_, val_;
  io::EpochOrder order_;
  torch::Device device_;
  double flops_per_row_;
};

}  // namespace kuafu::fold
