// The prepared data set (data_recipe's folder) as training examples: each chain's backbone from ProMod3's
// structure database, its MSA (a3m), and the AlphaFold features and labels of a crop of it, drawn from a
// seed so any rank draws the same.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "apps/fastfold/alphafold_losses.h"
#include "apps/fastfold/msa_features.h"
#include "apps/fastfold/structure_db.h"

namespace kuafu::fold {

// A chain's truth and alignment, whole.
struct FoldChain {
  std::string id;               // "12AS_A"
  std::string sequence;
  torch::Tensor aatype;         // [R] int64
  torch::Tensor residue_index;  // [R] int64
  torch::Tensor positions;      // [R, 37, 3] Å; the database's chains have N, CA, C and O only
  torch::Tensor mask;           // [R, 37]
  torch::Tensor recorded_atoms; // [37] 0/1: the atom types the source records (undefined: every type)
  MsaTensors msa;               // [N, R]
  torch::Tensor profile;        // [R, 21] the database's HHblits profile over AlphaFold's residue classes
                                // (unknown 0), or undefined
  std::string dssp;             // the database's DSSP state per residue (H B E G I T S C), or empty
};

// The chain from the database's backbone (its residue numbers from start_resnum on).
FoldChain chain_from_database(const StructureChain& chain, const std::string& id);

// A contiguous window of at most `crop` residues starting at `start` (the MSA's columns cut alike).
FoldChain crop_chain(const FoldChain& chain, int64_t start, int64_t crop);

// CB where the truth has it, else the ideal virtual CB from N, CA and C where those are present, CA for
// glycine: [R, 3] and its mask [R].
std::pair<torch::Tensor, torch::Tensor> pseudo_beta_or_virtual(const torch::Tensor& aatype, const torch::Tensor& positions,
                                                               const torch::Tensor& mask);

// `rows` alignment rows drawn column by column from the chain's profile (classes [rows, R]; no deletions),
// for chains whose MSA is shallow: the database keeps each chain's HHblits profile (its UniProt homologs'
// residue frequencies) but not their alignment.
MsaTensors profile_rows(const FoldChain& chain, int64_t rows, torch::Generator& generator);

// One example of a chain: `iterations` samples of its features (AlphaFold resamples the MSA at each
// recycling iteration) and the labels of the last.
struct FoldExample {
  std::vector<AlphaFoldFeatures> iterations;
  AlphaFoldLabels labels;
};
// With `extra_profile_rows` > 0 and a profile, that many rows drawn from it follow the MSA's own.
FoldExample make_example(const FoldChain& chain, const ResidueGeometry& geometry, const MsaSampling& sampling,
                         int64_t iterations, double clamped_fape_fraction, torch::Generator& generator,
                         int64_t extra_profile_rows = 0);

// The example with its residues, MSA rows and extra MSA rows each padded to a multiple of `multiple` with
// masked zeros, as AlphaFold pads crops to a fixed size (aatype 0, every mask 0): the real residues'
// outputs and the loss are unchanged. Dynamic axial parallelism needs the multiple of its group's size.
FoldExample pad_example(const FoldExample& example, int64_t multiple);

// Where a prepared folder's backbones come from: a structure database at hand, or its file, read when first
// needed (a folder with a current feature cache never needs it).
class DatabaseSource {
 public:
  DatabaseSource(const StructureDb& db) : db_(&db) {}  // NOLINT(google-explicit-constructor): a database at hand
  static DatabaseSource file(const std::string& path);
  const StructureDb& get() const;

 private:
  DatabaseSource() = default;
  const StructureDb* db_ = nullptr;
  std::string path_;
  mutable std::shared_ptr<StructureDb> read_;
};

// One split of a prepared folder: chains.tsv's chains of `split`, from the folder's feature cache
// (feature_cache.h) when it has one made from this chains.tsv, else with their a3m files and backbones from
// `db`. kuafu::Error naming the folder's file for a missing or malformed entry, or a chain the database
// lacks. `with_profiles`: each chain's HHblits profile too.
std::vector<FoldChain> read_prepared_split(const std::string& folder, const std::string& split, const DatabaseSource& db,
                                           bool with_profiles = false);
// The chain `id` of a prepared folder, whatever its split; kuafu::Error when chains.tsv has none.
FoldChain read_prepared_chain(const std::string& folder, const std::string& id, const DatabaseSource& db, bool with_profiles = false);
// Writes the folder's feature cache from its sources (every chain, with its profile); returns its path.
std::string write_prepared_cache(const std::string& folder, const DatabaseSource& db);

}  // namespace kuafu::fold
