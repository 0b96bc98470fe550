// kuafu-fold's config: the model's sizes, the prepared data and how examples are drawn from it, the
// data recipe's options for `prepare`, and the shared runtime / trainer / benchmark keys.
#pragma once

#include <string>

#include "apps/fastfold/alphafold_losses.h"
#include "apps/fastfold/alphafold_model.h"
#include "apps/fastfold/data_recipe.h"
#include "apps/fastfold/msa_features.h"
#include "core/config/config.h"

namespace kuafu::fold {

config::Schema fold_schema();

struct FoldSettings {
  AlphaFoldSizes model;
  std::string init_from;       // a params_model_*.npz to start from ("" none)
  std::string data_dir;        // the prepared folder (kuafu-fold prepare)
  std::string structure_db;    // ProMod3's database the folder's chains come from
  int64_t crop_size = 256;     // residues a training example keeps (a contiguous window)
  int64_t eval_crop_size = 384;
  int64_t max_recycles = 3;    // training draws 0..max per step (the same on every rank); evaluation uses max
  int64_t eval_chains = 0;     // 0: every validation chain
  MsaSampling sampling;
  int64_t profile_rows = 0;    // rows drawn from the database's HHblits profile, added to each MSA
  int64_t chunk_size = 0;      // predict and eval: the Evoformer's rows at a time (0: whole)
  double clamped_fape_fraction = 0.9;
  AlphaFoldLossSettings loss;
  uint64_t seed = 0;           // train.seed: data draws
};

FoldSettings read_fold_settings(const config::Config& config);
// prepare.* and data.* as the data recipe's options.
DataRecipeOptions read_recipe_options(const config::Config& config);

}  // namespace kuafu::fold
