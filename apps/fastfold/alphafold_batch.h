// AlphaFold's examples as the shared training path's batches of named features (core/hooks/batch.h): each
// feature and label under AlphaFold's own batch name, the features of every recycling iteration stacked
// under "iterations." (AlphaFold samples the MSA anew for each), one iteration's picked by iteration_features.
#pragma once

#include <vector>

#include "apps/fastfold/alphafold_losses.h"
#include "apps/fastfold/alphafold_model.h"
#include "core/hooks/batch.h"

namespace kuafu::fold {

// The iterations' features (each the same shapes) and, when given, the labels.
hooks::Batch alphafold_batch(const std::vector<AlphaFoldFeatures>& iterations, const AlphaFoldLabels* labels = nullptr);
// How many iterations a batch holds (1 for one iteration's).
int64_t batch_iterations(const hooks::Batch& batch);
// Iteration `i`'s features under their own names, with the labels.
hooks::Batch iteration_features(const hooks::Batch& batch, int64_t i);
// One iteration's features and the labels of a batch.
AlphaFoldFeatures features_of(const hooks::Batch& batch);
AlphaFoldLabels labels_of(const hooks::Batch& batch);

}  // namespace kuafu::fold
