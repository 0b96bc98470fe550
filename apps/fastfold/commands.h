// kuafu-fold's program: prepare (the data recipe), train, eval, predict, export and benchmark on the app
// skeleton (core/train/app.h).
#pragma once

#include <memory>
#include <string>

#include "apps/fastfold/alphafold_model.h"
#include "apps/fastfold/fold_data.h"
#include "apps/fastfold/structure.h"
#include "core/config/config.h"
#include "core/train/app.h"

namespace kuafu::fold {

std::unique_ptr<train::App> make_fold_app(const config::Config& config);

// A predicted chain as a PDB structure: every heavy atom its residue type has (or those `atom_mask`
// [R, 37] marks), pLDDT in the B-factor column, residues numbered as `residue_index`.
Structure predicted_structure(const std::string& sequence, const torch::Tensor& residue_index, const torch::Tensor& atom37,
                              const torch::Tensor& plddt, const torch::Tensor& atom_mask = {});

// The query of `predict`: a FASTA's first sequence, or a PDB's first chain's; with an a3m when given
// (its first row must be the query).
FoldChain query_chain(const std::string& fasta, const std::string& pdb, const std::string& a3m);

int run_fold_app(int argc, const char* const argv[]);

}  // namespace kuafu::fold
