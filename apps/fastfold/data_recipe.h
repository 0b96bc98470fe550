// FastFold's data recipe, its split and MSA stage: chains chosen from ProMod3's structure database,
// clustered by sequence identity with MMseqs2, split into train/val/test by cluster, and one a3m MSA a
// chain, searched against the training chains only as ColabFold builds its MSAs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "apps/fastfold/structure_db.h"

namespace kuafu::fold {

// Which chains of the database to use.
struct ChainSelection {
  size_t min_length = 40;   // residues; shorter chains are mostly peptides bound to something else
  size_t max_length = 1000;
  size_t max_chains = 0;    // 0: every chain that passes; else at most this many, drawn by `seed`
  uint64_t seed = 0;
  std::vector<std::string> only;  // chain ids ("12AS_A") to choose among, e.g. a curated set; empty: all
};

struct ChosenChain {
  std::string id;  // "12AS_A": PDB id, '_', chain name (unique in the database; names the chain's files)
  size_t db_index = 0;
  std::string sequence;
};

// The chains (of `only`, when given: an id the database lacks throws) whose length lies in [min_length,
// max_length], one per distinct sequence (the first in the database's order); when more than max_chains
// remain, the max_chains with the smallest hash of (seed, database index), so a chain's draw does not
// depend on the others. In the database's order.
std::vector<ChosenChain> select_chains(const StructureDb& db, const ChainSelection& selection);

// Sequence clusters: `mmseqs easy-cluster --min-seq-id --c --cov-mode --cluster-mode -s`.
struct ClusterOptions {
  double min_seq_id = 0.3;
  double coverage = 0.8;
  // 0: the alignment covers `coverage` of both sequences, as RCSB's sequence clusters and OpenFold3's
  // training clusters (mmseqs easy-cluster ... --cov-mode 0) use.
  int cov_mode = 0;
  int cluster_mode = 0;      // greedy set cover: MMseqs2's default, OpenFold3's
  double sensitivity = 8.0;  // -s, OpenFold3's
};

enum class Split { kTrain = 0, kVal = 1, kTest = 2 };
inline constexpr std::array<Split, 3> kSplits = {Split::kTrain, Split::kVal, Split::kTest};
const char* split_name(Split split);  // "train", "val", "test"

struct SplitOptions {
  double train = 0.8, val = 0.1, test = 0.1;  // fractions of the chains; they sum to 1
  uint64_t seed = 0;
};

// Splits groups of chains whole. `groups`: each a list of indices into the chains, together holding each
// of 0..chain_keys.size()-1 once; `chain_keys`: a number a chain (the run passes database indices, so a
// group's draw does not depend on which other chains were chosen). The groups go in the order of a hash
// of (seed, their smallest key), each to the split with the most chains left to its target
// (fraction × chains; ties: train, val, test; a split of fraction 0 gets none). Returns each chain's split.
std::vector<Split> assign_splits(const std::vector<std::vector<size_t>>& groups, const std::vector<size_t>& chain_keys,
                                 const SplitOptions& options);

// MSAs: `mmseqs search` (iterative profile search) of every chosen chain against the training chains, then
// `result2msa --msa-format-mode 6` with ColabFold's filters. Defaults are ColabFold's (colabfold_search).
struct MsaOptions {
  bool build = true;
  int num_iterations = 3;
  double sensitivity = 8.0;
  double evalue = 0.1;
  size_t max_seqs = 10000;
};

struct DataRecipeOptions {
  std::string structure_db = kDebianStructureDb;
  std::string out_dir;     // written whole or not at all
  bool overwrite = false;  // replace an existing out_dir (only once the new one is complete)
  std::string mmseqs = "mmseqs";  // a name looked up in $PATH, or a path
  int threads = 0;                // mmseqs --threads; 0: every core
  ChainSelection selection;
  ClusterOptions cluster;
  SplitOptions split;
  MsaOptions msa;
};

struct DataRecipeSummary {
  size_t chains = 0;
  size_t clusters = 0;      // MMseqs2's clusters
  size_t cross_links = 0;   // pairs of chains in different clusters that still meet the thresholds
  size_t groups = 0;        // clusters joined by those links: what is split
  std::array<size_t, 3> split_chains{}, split_clusters{};  // by Split
  // Rows of each chain's MSA, the query included.
  size_t msa_min_depth = 0, msa_max_depth = 0, msa_median_depth = 0, msa_query_only = 0;
  double msa_mean_depth = 0;
  double select_seconds = 0, cluster_seconds = 0, link_seconds = 0, msa_seconds = 0, total_seconds = 0;
  std::string mmseqs_version;
};

// Runs the stage and writes `out_dir`:
//   manifest.json    options, MMseqs2's version, the commands run, counts, and each split's chains
//                    (id, database index);
//   chains.tsv       chain_id db_index length split cluster group (cluster: its MMseqs2 representative;
//                    group: the first chain of its group in the database's order);
//   clusters.tsv     MMseqs2's clusters: representative, member (in the database's order);
//   links.tsv        the pairs of chains of different clusters that meet the thresholds (query, target,
//                    identity, query coverage, target coverage; the query first in the database);
//   sequences.fasta  the chosen chains;
//   msas/<id>.a3m    when msa.build: the query first, then hits from training chains only (a training
//                    chain's own row dropped).
// Two clusters can still hold a pair of chains that meets the thresholds (a greedy set cover checks each
// member against its representative only; at OpenFold3's -s 8: 5 such pairs in 300 chains of families,
// 12 in 2,000 random chains), so every pair of chosen chains is aligned as well (`ungappedprefilter`
// over all pairs the coverage allows, then `align`: Smith-Waterman) and the clusters such a pair joins
// are split together. No val or test chain then has a training chain at >= min_seq_id identity over
// >= coverage of both, by MMseqs2's alignment: their MSAs hold training hits below that identity or
// covering less. Options and the database are checked and mmseqs is looked up before any work; an
// existing out_dir is refused unless `overwrite`; a failure leaves no folder behind.
DataRecipeSummary run_data_recipe(const DataRecipeOptions& options);

}  // namespace kuafu::fold
