#include "apps/fastfold/fold_task.h"

#include <algorithm>
#include <cmath>

#include <torch/torch.h>

#include "apps/fastfold/alphafold_flops.h"
#include "apps/fastfold/alphafold_batch.h"
#include "core/util/error.h"
#include "core/util/seed_mix.h"

namespace kuafu::fold {
namespace {

torch::Generator generator_of(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

// A training row's matrix-product FLOPs, averaged over the chains an epoch visits once each: its crop, its
// MSA's clusters and extra rows as make_example samples them, the mean number of recycling iterations.
double mean_training_flops(const std::vector<FoldChain>& chains, const FoldSettings& settings) {
  if (chains.empty()) return 0;
  const double iterations = 1 + 0.5 * static_cast<double>(settings.max_recycles);
  double total = 0;
  for (const FoldChain& chain : chains) {
    const int64_t rows = chain.msa.rows.size(0) + (chain.profile.defined() ? settings.profile_rows : 0);
    const int64_t clusters = std::min(settings.sampling.max_clusters, rows);
    const FoldShape shape{std::min(chain.aatype.size(0), settings.crop_size), clusters,
                          std::min(settings.sampling.max_extra, rows - clusters)};
    total += alphafold_training_flops(settings.model, shape, iterations);
  }
  return total / static_cast<double>(chains.size());
}

// The chain's example for prediction: `iterations` samples of its MSA as it is (no BERT masking), drawn by `seed`.
FoldExample prediction_example(const FoldChain& chain, const FoldSettings& settings, int64_t iterations, uint64_t seed) {
  MsaSampling sampling = settings.sampling;
  sampling.replace_fraction = 0;
  torch::Generator generator = generator_of(seed);
  return make_example(chain, ideal_residue_geometry(), sampling, iterations, settings.clamped_fape_fraction, generator,
                      settings.profile_rows);
}

}  // namespace

hooks::Batch example_batch(AlphaFoldImpl& model, const FoldExample& example, const torch::Device& device) {
  return example_batch(model, example, device, model.output_dtype());
}

hooks::Batch example_batch(AlphaFoldImpl& model, const FoldExample& example, const torch::Device& device, torch::Dtype dtype) {
  const torch::TensorOptions options = torch::TensorOptions(dtype).device(device);
  const FoldExample padded = pad_example(example, model.layout.parts());
  std::vector<AlphaFoldFeatures> iterations;
  for (const AlphaFoldFeatures& f : padded.iterations) iterations.push_back(f.to(options));
  const AlphaFoldLabels labels = padded.labels.to(options);
  return alphafold_batch(iterations, &labels);
}

AlphaFoldLoss example_loss(AlphaFoldImpl& model, const FoldExample& example, const FoldSettings& settings,
                           const torch::Device& device, AlphaFoldOutputs* kept) {
  const hooks::Batch batch = example_batch(model, example, device);
  AlphaFoldOutputs out = model.forward(batch);
  const AlphaFoldLoss loss = model.training_loss(out, batch, settings.loss);
  if (kept) *kept = std::move(out);
  return loss;
}

Prediction predict_chain(AlphaFoldImpl& model, const FoldChain& chain, const FoldSettings& settings, int64_t iterations,
                         uint64_t seed, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  const int64_t training_chunk = model.chunk_size;
  model.chunk_size = settings.chunk_size;
  // A query without a truth (at least 3 Cα) has no loss or scores: its FAPE alone, frames x atoms of every
  // layer, would outweigh the model's own activations at long lengths.
  const int64_t ca = 1;
  const torch::Tensor truth = chain.positions.select(1, ca), mask = chain.mask.select(1, ca);
  const bool scored = mask.sum().item<double>() >= 3;
  Prediction p;
  const hooks::Batch batch = example_batch(model, prediction_example(chain, settings, iterations, seed), device);
  p.outputs = model.forward(batch);
  if (scored) p.loss = model.training_loss(p.outputs, batch, settings.loss).total.item<double>();
  model.chunk_size = training_chunk;
  p.outputs = p.outputs.first_residues(chain.aatype.size(0));  // without the padding DAP added
  p.plddt = plddt_of_logits(p.outputs.plddt_logits).cpu();
  const torch::Tensor predicted = p.outputs.atom37.select(1, ca).cpu();
  p.true_lddt = lddt(predicted.unsqueeze(0), truth.unsqueeze(0), mask.view({1, -1, 1}), 15.0, true)[0];
  if (scored) p.scores = structure_scores(predicted, truth, mask);
  const torch::Tensor atom14 = p.outputs.structure.atom14.select(0, -1);  // [R, 14, 3]
  const torch::Tensor aatype = chain.aatype.to(atom14.device());
  const torch::Tensor exists = per_residue(ideal_residue_geometry().atom14_exists.to(atom14.options()), aatype);
  const StructuralViolations violations =
      structural_violations(atom14, exists, aatype, chain.residue_index.to(atom14.device()),
                            atom14_distance_bounds(settings.loss.violation), settings.loss.violation);
  p.violations = violation_fractions(violations, torch::ones({chain.aatype.size(0)}, atom14.options()));
  p.violation_loss = violation_loss(violations, exists).item<double>();
  return p;
}

FoldTask::FoldTask(AlphaFold model, FoldSettings settings, std::vector<FoldChain> train, std::vector<FoldChain> val,
                   int64_t batch_size, const torch::Device& device, const train::ParallelOptions& options)
    : ModelTask(std::make_unique<train::ParallelModel>(*model, options), /*micro_batch=*/1, /*row_block=*/1, /*row_batches=*/true),
      model_(std::move(model)), settings_(std::move(settings)), train_(std::move(train)), val_(std::move(val)),
      order_(static_cast<int64_t>(train_.size()), batch_size, settings_.seed), device_(device),
      flops_per_row_(mean_training_flops(train_, settings_)) {
  model_->loss_settings = settings_.loss;
}

uint64_t FoldTask::eval_seed(int64_t chain) const { return mix_seed(settings_.seed, -1, chain, 2); }

int64_t FoldTask::iterations_of(int64_t step) const {
  torch::Generator generator = generator_of(mix_seed(settings_.seed, step, -1, 0));
  return 1 + torch::randint(0, settings_.max_recycles + 1, {1}, generator, torch::kInt64).item<int64_t>();
}

train::Batch FoldTask::train_batch(int64_t step, int64_t first_row, int64_t rows) {
  KUAFU_CHECK(rows == 1, "a FoldTask batch is one crop (chains differ in length)");
  torch::Generator generator = generator_of(mix_seed(settings_.seed, step, first_row, 1));
  const FoldChain& chain = train_[order_.rows(step, first_row, 1).front()];
  const int64_t length = chain.aatype.size(0);
  const int64_t start = length > settings_.crop_size
                            ? torch::randint(0, length - settings_.crop_size + 1, {1}, generator, torch::kInt64).item<int64_t>()
                            : 0;
  const FoldExample example = make_example(crop_chain(chain, start, settings_.crop_size), ideal_residue_geometry(),
                                           settings_.sampling, iterations_of(step), settings_.clamped_fape_fraction, generator,
                                           settings_.profile_rows);
  return example_batch(*model_, example, device_);
}

train::Batch FoldTask::eval_batch(int64_t first_row, int64_t rows) {
  KUAFU_CHECK(rows == 1, "a FoldTask batch is one chain");
  const FoldChain chain = crop_chain(val_.at(static_cast<size_t>(first_row)), 0, settings_.eval_crop_size);
  const FoldExample example = prediction_example(chain, settings_, settings_.max_recycles + 1, eval_seed(first_row));
  return example_batch(*model_, example, device_);
}

std::map<std::string, double> FoldTask::step_figures(int64_t step) {
  return {{"recycling_iterations", static_cast<double>(iterations_of(step))}};
}

train::LossSum FoldTask::evaluate(int rank, int ranks) {
  const int64_t n = settings_.eval_chains > 0 ? std::min<int64_t>(settings_.eval_chains, static_cast<int64_t>(val_.size()))
                                              : static_cast<int64_t>(val_.size());
  train::LossSum sums;
  // extra: lDDT-Cα, TM-score, GDT-TS, RMSD sums; then Σx, Σy, Σx², Σy², Σxy, count over residues of
  // (pLDDT/100, true lDDT) for Pearson's r over every rank's residues.
  // Then the baselines' lDDT-Cα: the ideal helix's, the secondary-structure chain's and the chains it had.
  // Then the fraction of residues with a structural violation, and the violation loss.
  sums.extra.assign(15, 0.0);
  model_->eval();
  for (int64_t i = n * rank / ranks; i < n * (rank + 1) / ranks; ++i) {
    const FoldChain chain = crop_chain(val_[static_cast<size_t>(i)], 0, settings_.eval_crop_size);
    const Prediction p = predict_chain(*model_, chain, settings_, settings_.max_recycles + 1, eval_seed(i), device_);
    sums.loss_sum += p.loss;
    sums.count += 1;
    sums.extra[0] += p.scores.lddt_ca;
    sums.extra[1] += p.scores.tm_score;
    sums.extra[2] += p.scores.gdt_ts;
    sums.extra[3] += p.scores.rmsd_ca;
    const torch::Tensor x = (p.plddt / 100.0).to(torch::kFloat64), y = p.true_lddt.to(torch::kFloat64);
    sums.extra[4] += x.sum().item<double>();
    sums.extra[5] += y.sum().item<double>();
    sums.extra[6] += x.square().sum().item<double>();
    sums.extra[7] += y.square().sum().item<double>();
    sums.extra[8] += (x * y).sum().item<double>();
    sums.extra[9] += static_cast<double>(x.numel());
    const torch::Tensor truth = chain.positions.select(1, 1).to(torch::kFloat64), mask = chain.mask.select(1, 1);
    const auto baseline = [&](const torch::Tensor& ca) {
      return lddt(ca.unsqueeze(0), truth.unsqueeze(0), mask.to(torch::kFloat64).view({1, -1, 1}))[0].item<double>();
    };
    sums.extra[10] += baseline(ideal_helix_ca(truth.size(0)));
    if (!chain.dssp.empty()) {
      sums.extra[11] += baseline(secondary_structure_ca(chain.dssp));
      sums.extra[12] += 1;
    }
    sums.extra[13] += p.violations.any;
    sums.extra[14] += p.violation_loss;
  }
  model_->train();
  return sums;
}

std::vector<train::EvalMetric> FoldTask::eval_metrics(const train::LossSum& s) const {
  const double chains = std::max(s.count, 1.0);
  const double n = s.extra[9];
  const double denominator = std::sqrt((n * s.extra[6] - s.extra[4] * s.extra[4]) * (n * s.extra[7] - s.extra[5] * s.extra[5]));
  const double r = denominator > 0 ? (n * s.extra[8] - s.extra[4] * s.extra[5]) / denominator : 0.0;
  return {{"val_lddt_ca", "lDDT-Ca", s.extra[0] / chains, false},
          {"val_tm_score", "TM-score", s.extra[1] / chains, false},
          {"val_gdt_ts", "GDT-TS", s.extra[2] / chains, false},
          {"val_rmsd_ca", "RMSD", s.extra[3] / chains, false},
          {"val_plddt_r", "pLDDT r", r, false},
          {"val_helix_lddt_ca", "ideal-helix lDDT-Ca", s.extra[10] / chains, false},
          {"val_ss_lddt_ca", "secondary-structure lDDT-Ca", s.extra[11] / std::max(s.extra[12], 1.0), false},
          {"val_violations", "residues with violations", s.extra[13] / chains, false},
          {"val_violation_loss", "violation loss", s.extra[14] / chains, false}};
}

}  // namespace kuafu::fold
