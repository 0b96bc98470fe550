// PDB files read into chains of residues by the rules of AlphaFold's data pipeline (structure.h), and
// written back.
#pragma once


#include <string>
#include <string_view>

#include "apps/fastfold/structure.h"
#include "apps/fastfold/text_fields.h"

namespace kuafu::fold {

// Reads the first model's ATOM/HETATM records (MODEL/ENDMDL; all models are checked, one is kept):
// - an atom with alternative locations (altloc column) keeps the one of highest occupancy, the first
//   on ties (Biopython's choice, which AlphaFold reads through); a residue whose alternatives are
//   different residues (microheterogeneity: "APRO"/"BSER") keeps the residue name of its first atom;
// - MSE is read as MET with its SE atom as SD (as AlphaFold's templates do); the element stays SE;
// - HETATM waters (HOH, WAT, DOD) are dropped; other HETATM residues are kept;
// - a residue is a run of records with the same chain, number and insertion code, in file order;
//   a chain id met again later (ligands after TER) adds to that chain;
// - SEQRES, when present, gives each chain's full sequence; its residues are matched to those with
//   coordinates in order, keeping the numbering's gaps where there is a choice (see Chain).
// Coordinates, occupancy and B-factor (through column 66) are required; an element left blank is
// guessed from the atom name (as biotite does). A line that cannot be read throws kuafu::Error
// naming the file and line, what was expected in which columns and what was found.
Structure read_pdb(const std::string& path);
// The same from text in memory; `name` stands for the file in errors.
Structure parse_pdb(std::string_view text, const std::string& name);

// SEQRES (when a chain has a sequence), then ATOM/HETATM records of every chain with a TER after
// each, then END. Coordinates are written with 3 decimals, so reading the file back gives them to
// within 0.0005 Å. Throws kuafu::Error for what PDB columns cannot hold: chain ids longer than one
// character, residue names over 3 or atom names over 4, numbers or coordinates too wide, 99,999 atoms.
std::string format_pdb(const Structure& structure);
void write_pdb(const Structure& structure, const std::string& path);  // atomically

}  // namespace kuafu::fold
