// PDB files read into chains of residues by the rules of AlphaFold's data pipeline, and written back.
// The structure type here is also what mmcif_file.h reads into.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/util/error.h"

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

// The whole file as text, gunzipped when its name ends in ".gz" (Debian ships its examples so);
// kuafu::Error naming the path when it cannot be read.
std::string read_text_file(const std::string& path);

// Helpers the three readers share: "file:line: message" as a kuafu::Error; strict numbers (the
// whole field, no "nan"/"inf", surrounding blanks allowed), nullopt for anything else.
[[noreturn]] void fail_at_line(const std::string& file, size_t line, const std::string& message);
std::optional<double> parse_decimal(std::string_view field);
std::optional<int> parse_integer(std::string_view field);

// One atom as a file lists it, before the rules above: what the PDB and mmCIF readers hand to
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

// Reading many files: each path is read with `read`; a file that throws kuafu::Error is skipped
// while at most `max_bad_files` have been, its message kept; one more throws an Error counting them.
template <typename T>
struct FileBatch {
  std::vector<T> read;               // in the order of the paths, bad files left out
  std::vector<std::string> skipped;  // the error of each file skipped
};

template <typename T, typename Read>
FileBatch<T> read_files(const std::vector<std::string>& paths, size_t max_bad_files, Read read) {
  FileBatch<T> batch;
  for (size_t i = 0; i < paths.size(); ++i) {
    try {
      batch.read.push_back(read(paths[i]));
    } catch (const Error& e) {
      batch.skipped.push_back(e.what());
      if (batch.skipped.size() > max_bad_files) {
        std::string message = detail::concat(batch.skipped.size(), " bad files among the first ", i + 1, " of ",
                                             paths.size(), ", more than max_bad_files = ", max_bad_files, ":");
        for (const std::string& error : batch.skipped) message += "\n  " + error;
        throw Error(message);
      }
    }
  }
  return batch;
}

}  // namespace kuafu::fold
