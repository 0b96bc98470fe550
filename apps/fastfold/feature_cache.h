// A prepared folder's chains in one HDF5 file (<data.dir>/features.h5): each chain's sequence, residue
// numbers, backbone (N, CA, C, O), DSSP states, HHblits profile and MSA (rows and deletion counts), so that
// training and prediction read the folder without ProMod3's structure database or parsing its a3m files.
// It records the CRC-32 of the chains.tsv it was made from; once chains.tsv changes it is not used.
//
// Layout: "chains" (uint8: "id<TAB>split<LF>" per chain), "table" int64 [C, 5] (first residue, residues,
// first MSA entry, MSA rows, the chain's first residue number), then per residue "sequence" uint8,
// "backbone" float32 [ΣR, 4, 3] (N, CA, C, O), "dssp" uint8, "profile" float32 [ΣR, 21], and per MSA entry
// (row by row) "msa" uint8 (AlphaFold's classes) and "deletions" int32. It holds database chains only (as
// chain_from_database makes them), and the reader rebuilds each through chain_from_database.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "apps/fastfold/fold_data.h"

namespace kuafu::fold {

inline constexpr char kFeatureCacheFile[] = "features.h5";

struct SplitChain {
  FoldChain chain;  // with its profile (the cache keeps every chain's)
  std::string split;
};

// Writes `path` (replacing it atomically) from `chains`, made from a chains.tsv of CRC-32 `source_crc`.
void write_feature_cache(const std::string& path, const std::vector<SplitChain>& chains, uint32_t source_crc);

// The chains of `path` that `keep(id, split)` selects, in the file's order (chains.tsv's), each with its
// profile when `with_profiles`; none (std::nullopt) when there is no such file or it was made from another
// chains.tsv. kuafu::Error naming the file and dataset for a file that does not read as one.
std::optional<std::vector<FoldChain>> read_feature_cache(const std::string& path, uint32_t source_crc, bool with_profiles,
                                                         const std::function<bool(const std::string& id, const std::string& split)>& keep);

}  // namespace kuafu::fold
