// A chain's amino acids as the model's tensors: residue types and every heavy atom in the atom37 layout.
#pragma once

#include <string>

#include <torch/types.h>

#include "apps/fastfold/structure.h"

namespace kuafu::fold {

struct ChainAtoms {
  std::string sequence;         // one letter per residue, 'X' for a non-standard amino acid
  torch::Tensor aatype;         // [R] int64, AlphaFold's numbering (20: unknown)
  torch::Tensor positions;      // [R, 37, 3] float32, Å (0 where absent)
  torch::Tensor mask;           // [R, 37] float32: 1 where the file has the atom
  torch::Tensor residue_index;  // [R] int64: the author's residue numbers
};

// The chain's amino-acid residues with coordinates, in file order: those read from ATOM records (MSE read as
// MET included) that have a CA; ligands and waters are left out. Atoms outside atom37 (hydrogens, OXT
// aside) are ignored.
ChainAtoms chain_atoms(const Chain& chain);

}  // namespace kuafu::fold
