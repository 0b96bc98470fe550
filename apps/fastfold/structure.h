// A structure as the readers give it (PDB files, mmCIF): chains of residues of atoms, first model only,
// by the rules of AlphaFold's data pipeline (StructureBuilder), and a chain's full sequence matched to the
// residues with coordinates.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace kuafu::fold {

struct Atom {
  std::string name;                  // "CA" (columns 13-16 without spaces; mmCIF label_atom_id)
  std::string element;               // "C"; guessed from the name where the file leaves it blank
  std::array<double, 3> position{};  // Å
  double occupancy = 1.0;
  double b_factor = 0.0;             // what write_pdb writes into the B-factor column (e.g. pLDDT)
};

struct Residue {
  std::string name;           // "MET" (selenomethionine, MSE, is read as MET)
  int number = 0;             // the author's numbering (PDB columns 23-26; mmCIF auth_seq_id)
  char insertion_code = ' ';  // ' ': none; 52 and 52A are two residues
  bool hetero = false;        // a HETATM record (an MSE read as MET is not)
  std::vector<Atom> atoms;    // in file order, one per atom name
};

struct Chain {
  std::string id;                 // PDB column 22 ("" when blank); mmCIF auth_asym_id
  std::vector<Residue> residues;  // those with coordinates, in file order (ligands included)
  // The full sequence when the file gives one (PDB SEQRES; mmCIF _pdbx_poly_seq_scheme or
  // _entity_poly_seq), MSE as MET, and for each of its residues the index in `residues` of its
  // coordinates, or -1 where the structure lacks it. Both empty when the file gives no sequence.
  std::vector<std::string> sequence;
  std::vector<int> sequence_to_residue;
};

struct Structure {
  std::string path;           // as given to the reader (what errors name)
  int num_models = 1;         // models in the file; only the first is read
  std::vector<Chain> chains;  // in order of first appearance; a chain id appears once

  const Chain* chain(std::string_view id) const;  // nullptr when there is none
};

// The one-letter code of a standard amino acid ("ALA" -> 'A'), 'X' for anything else.
char one_letter_code(std::string_view residue_name);

// The rules every reader applies (read_pdb documents them): altlocs by occupancy, MSE as MET, waters
// dropped, residues as runs of records, chains by id.
// One atom as a file lists it, before the rules below: what the PDB and mmCIF readers hand to
// StructureBuilder.
struct AtomRecord {
  std::string chain_id;
  std::string residue_name;
  int residue_number = 0;
  char insertion_code = ' ';
  bool hetero = false;
  char altloc = ' ';  // ' ': none
  Atom atom;
};

// Applies the rules above to atom records given in file order (one model); guesses blank elements.
class StructureBuilder {
 public:
  // Where a record went: its chain and residue, or -1 for both when it was dropped.
  struct Place {
    int chain = -1;
    int residue = -1;
  };
  Place add(AtomRecord record);
  std::vector<Chain> finish() { return std::move(chains_); }

 private:
  std::vector<Chain> chains_;
  Place current_;                   // the residue the last kept record went to
  std::string current_name_;        // its name as read (before MSE -> MET)
};

// Matches a chain's full sequence to its residues with coordinates (each residue at most once, in
// order, names equal): the most residues matched, then the most consecutive pairs whose numbering
// step agrees with the positions skipped. Fills chain.sequence and chain.sequence_to_residue.
void match_sequence(Chain& chain, std::vector<std::string> sequence, const std::string& file);

}  // namespace kuafu::fold
