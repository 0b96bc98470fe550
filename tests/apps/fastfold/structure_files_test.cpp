// FastFold's file readers against biotite (structure_files_reference.py) on Debian's example files
// (theseus-examples, python3-prody-tests, t-coffee-examples): PDB and mmCIF atoms, residues and chains,
// SEQRES against REMARK 465, _pdbx_poly_seq_scheme, FASTA; hand-made files for altlocs, insertion
// codes, MSE, models, HETATM, cut and non-numeric lines, CIF syntax, a3m/a2m/Stockholm deletion
// matrices by AlphaFold's rules (alphafold/data/parsers.py); write -> read; many files with bad ones.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <numeric>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/fastfold/alignment_files.h"
#include "apps/fastfold/file_batch.h"
#include "apps/fastfold/mmcif_file.h"
#include "apps/fastfold/pdb_file.h"
#include "core/util/error.h"
#include "core/util/text.h"
#include "tests/support/run_command.h"
#include "tests/support/test_util.h"

namespace kuafu::fold {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kTheseus = "/usr/share/doc/theseus/examples";
const fs::path kTCoffee = "/usr/share/doc/t-coffee/examples";
const fs::path kProdyData = "/usr/lib/python3/dist-packages/prody/tests/datafiles";
const fs::path kPython = fs::path(KUAFU_SOURCE_DIR) / ".venv/bin/python";
const fs::path kScript = fs::path(KUAFU_SOURCE_DIR) / "tests/apps/fastfold/structure_files_reference.py";


// Every file of `dir` (and below) whose name ends in one of `endings`, sorted.
std::vector<std::string> files_in(const fs::path& dir, std::initializer_list<const char*> endings) {
  std::vector<std::string> found;
  if (!fs::exists(dir)) return found;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    for (const char* ending : endings) {
      if (entry.is_regular_file() && text::ends_with(entry.path().string(), ending)) found.push_back(entry.path());
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::string> pdb_files() {
  std::vector<std::string> all = files_in(kTheseus, {".pdb.gz"});
  for (const auto& more : {files_in(kTCoffee, {".pdb.gz"}), files_in(kProdyData, {".pdb"})}) {
    all.insert(all.end(), more.begin(), more.end());
  }
  return all;
}

const std::string kLdhInsertions = (kTheseus / "ldh/1a5z_A.pdb.gz").string();  // insertion codes, waters
const std::string kLdhMse = (kTheseus / "ldh/2e37_A.pdb.gz").string();          // MSE, HETATM waters
const std::string kNmr = (kTheseus / "1adz.pdb.gz").string();                   // 30 models
const std::vector<std::string> kCifFiles = {(kProdyData / "mmcif_6yfy.cif").string(),   // NMR, 20 models
                                            (kProdyData / "mmcif_6zu5.cif").string()};  // ribosome, 80 chains

// (biotite's FastaFile is a dictionary: a file that repeats a header, as prody's msa_Cys_knot.fasta
// does, cannot be compared.)
std::vector<std::string> fasta_files() {
  std::vector<std::string> files;
  for (const char* name : {"proteases_small.fasta", "sample_seq1.fasta", "three_pdb.fasta", "sample_3Dseq1.fasta",
                           "b11.fa", "proteases_large.fasta.gz", "c18orf19.fa.gz", "proteases_small.fasta_aln.gz"}) {
    files.push_back((kTCoffee / name).string());
  }
  return files;
}

// The reference, run once for the process: one output a line of inputs.txt ("<kind> <path>").
struct Reference {
  fs::path dir;
  std::vector<std::pair<std::string, std::string>> inputs;
  fs::path output(size_t n, const char* ending) const { return dir / (std::to_string(n) + ending); }
  size_t index(const std::string& kind, const std::string& path) const {
    for (size_t n = 0; n < inputs.size(); ++n) {
      if (inputs[n] == std::make_pair(kind, path)) return n;
    }
    throw Error("no reference input " + kind + " " + path);
  }
};

fs::path reference_dir;  // set once the reference has run

// The reference's folder (100 MB of atoms) goes when the tests end.
class RemoveReference : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!reference_dir.empty()) fs::remove_all(reference_dir);
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveReference =
    ::testing::AddGlobalTestEnvironment(new RemoveReference);

const Reference& reference() {
  static const Reference ref = [] {
    Reference r{testing::temp_dir("structure_files_reference"), {}};
    reference_dir = r.dir;
    for (const std::string& p : pdb_files()) r.inputs.emplace_back("pdb", p);
    for (const std::string& p : kCifFiles) r.inputs.emplace_back("cif", p);
    for (const std::string& p : {kLdhInsertions, kLdhMse, kNmr}) r.inputs.emplace_back("convert", p);
    for (const std::string& p : fasta_files()) r.inputs.emplace_back("fasta", p);
    // A missing package fails here rather than shrinking the test.
    for (const auto& [kind, path] : r.inputs) {
      if (!fs::exists(path)) throw Error(path + " is missing: scripts/setup installs Debian's example packages");
    }
    if (r.inputs.size() < 400) throw Error("fewer example structures than Debian's packages hold: run scripts/setup");
    std::ofstream list(r.dir / "inputs.txt");
    for (const auto& [kind, path] : r.inputs) list << kind << " " << path << "\n";
    list.close();
    const auto run = kuafu::testing::run_command(kPython.string() + " " + kScript.string() + " " + r.dir.string());
    if (run.exit_code != 0 || !fs::exists(r.dir / "done")) {
      throw Error("structure_files_reference.py failed (it needs biotite in .venv: run scripts/setup):\n" + run.output);
    }
    std::cout << run.output;
    return r;
  }();
  return ref;
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}


#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// What the reference lists, atom by atom.
struct Differences {
  size_t atoms = 0;
  double coordinates = 0, occupancy = 0, b_factor = 0;
};

void compare_with_tsv(const Structure& s, const fs::path& tsv, Differences& d, bool float32_reference) {
  std::ifstream in(tsv);
  std::string line;
  size_t row = 0;
  for (const Chain& chain : s.chains) {
    for (const Residue& residue : chain.residues) {
      for (const Atom& atom : residue.atoms) {
        ASSERT_TRUE(std::getline(in, line)) << s.path << ": we read more atoms than the reference (" << row << ")";
        const std::vector<std::string> f = text::split(line, '\t');
        ASSERT_EQ(f.size(), 12u) << tsv << ": " << line;
        const auto where = [&] { return s.path + " atom " + std::to_string(row) + " (" + line + ")"; };
        ASSERT_EQ(chain.id, f[0]) << where();
        ASSERT_EQ(residue.number, std::stoi(f[1])) << where();
        ASSERT_EQ(residue.insertion_code, f[2][0]) << where();
        ASSERT_EQ(residue.name, f[3]) << where();
        ASSERT_EQ(residue.hetero, f[4] == "1") << where();
        ASSERT_EQ(atom.name, f[5]) << where();
        ASSERT_EQ(atom.element, f[6]) << where();
        for (int k = 0; k < 3; ++k) {
          const double ours = atom.position[size_t(k)], theirs = std::stod(f[7 + size_t(k)]);
          d.coordinates = std::max(d.coordinates, std::abs(ours - theirs));
          // biotite's PDB reader holds coordinates as float32 (the text's double, rounded): ours, rounded
          // so, must be the same number. Its CIF columns are the text's doubles.
          if (float32_reference) {
            ASSERT_EQ(static_cast<float>(ours), static_cast<float>(theirs)) << where();
          } else {
            ASSERT_EQ(ours, theirs) << where();
          }
        }
        d.occupancy = std::max(d.occupancy, std::abs(atom.occupancy - std::stod(f[10])));
        d.b_factor = std::max(d.b_factor, std::abs(atom.b_factor - std::stod(f[11])));
        ++row;
      }
    }
  }
  EXPECT_FALSE(std::getline(in, line)) << s.path << ": the reference lists more atoms than our " << row;
  d.atoms += row;
}

size_t count_atoms(const Structure& s) {
  size_t n = 0;
  for (const Chain& c : s.chains) {
    for (const Residue& r : c.residues) n += r.atoms.size();
  }
  return n;
}

TEST(StructureFilesTest, PdbMatchesBiotite) {
  const Reference& ref = reference();
  Differences d;
  size_t files = 0, refused = 0, models = 0, residues = 0;
  for (size_t n = 0; n < ref.inputs.size(); ++n) {
    const auto& [kind, path] = ref.inputs[n];
    if (kind != "pdb") continue;
    SCOPED_TRACE(path);
    if (fs::exists(ref.output(n, ".error"))) {
      // biotite refuses it too: we name the file and a line.
      const std::string message = testing::expected_error([&] { read_pdb(path); });
      EXPECT_CONTAINS(message, path + ":");
      std::cout << "refused, as by biotite: " << message << "\n";
      ++refused;
      continue;
    }
    const Structure s = read_pdb(path);
    EXPECT_EQ(s.num_models, read_json(ref.output(n, ".json"))["models"].get<int>());
    compare_with_tsv(s, ref.output(n, ".tsv"), d, true);
    if (HasFatalFailure()) return;
    ++files;
    models += size_t(s.num_models);
    for (const Chain& c : s.chains) residues += c.residues.size();
  }
  std::cout << "PDB: " << files << " files (" << models << " models, " << residues << " residues, " << d.atoms
            << " atoms) as biotite reads them; max difference: coordinates " << d.coordinates
            << " Å (biotite's float32; equal as float32), occupancy " << d.occupancy
            << ", B-factor " << d.b_factor << "; " << refused << " files refused by both\n";
  EXPECT_GE(files, 490u);
  EXPECT_EQ(refused, 2u);  // prody's hexadecimal residue numbers, and a z coordinate spilling into column 55
  EXPECT_LE(d.occupancy, 1e-6);
  EXPECT_LE(d.b_factor, 1e-4);
}

// Every position of a chain's SEQRES without coordinates is one that REMARK 465 lists as missing, in
// order, between the residues with coordinates that its number falls between.
TEST(StructureFilesTest, SeqresMissingResiduesAreRemark465s) {
  const Reference& ref = reference();
  size_t chains = 0, positions = 0, missing = 0, checked = 0;
  for (size_t n = 0; n < ref.inputs.size(); ++n) {
    const auto& [kind, path] = ref.inputs[n];
    if (kind != "pdb" || !fs::exists(ref.output(n, ".json"))) continue;
    const json expected = read_json(ref.output(n, ".json"));
    if (expected["seqres"].empty()) continue;
    SCOPED_TRACE(path);
    const Structure s = read_pdb(path);
    for (const Chain& chain : s.chains) {
      if (!expected["seqres"].contains(chain.id)) {
        EXPECT_TRUE(chain.sequence.empty()) << chain.id;
        continue;
      }
      EXPECT_EQ(chain.sequence, expected["seqres"][chain.id].get<std::vector<std::string>>()) << chain.id;
      std::vector<size_t> unmatched;
      for (size_t j = 0; j < chain.sequence.size(); ++j) {
        const int i = chain.sequence_to_residue[j];
        if (i < 0) {
          unmatched.push_back(j);
        } else {
          EXPECT_EQ(chain.residues[size_t(i)].name, chain.sequence[j]);
          EXPECT_TRUE(j == 0 || chain.sequence_to_residue[j - 1] < i);
        }
      }
      ++chains;
      positions += chain.sequence.size();
      missing += unmatched.size();
      if (!expected["remark465"].get<bool>()) continue;  // older files: nothing to check the gaps against
      const json listed = expected["missing"].value(chain.id, json::array());
      ASSERT_EQ(unmatched.size(), listed.size()) << "chain " << chain.id;
      ++checked;
      for (size_t k = 0; k < unmatched.size(); ++k) {
        const size_t j = unmatched[k];
        const int number = listed[k][1].get<int>();
        EXPECT_EQ(chain.sequence[j], listed[k][0].get<std::string>()) << "chain " << chain.id << " position " << j;
        // The residues with coordinates on either side are numbered below and above it.
        for (size_t before = j; before-- > 0;) {
          if (chain.sequence_to_residue[before] >= 0) {
            EXPECT_LT(chain.residues[size_t(chain.sequence_to_residue[before])].number, number) << chain.id << j;
            break;
          }
        }
        for (size_t after = j + 1; after < chain.sequence.size(); ++after) {
          if (chain.sequence_to_residue[after] >= 0) {
            EXPECT_GT(chain.residues[size_t(chain.sequence_to_residue[after])].number, number) << chain.id << j;
            break;
          }
        }
      }
    }
  }
  std::cout << "SEQRES: " << chains << " chains, " << positions << " positions, " << missing
            << " without coordinates; in the " << checked << " chains of files with REMARK 465, each such position is"
            << " one of its entries\n";
  EXPECT_GE(checked, 10u);
  EXPECT_GE(missing, 50u);
}

TEST(StructureFilesTest, MmcifMatchesBiotite) {
  const Reference& ref = reference();
  Differences d;
  size_t sequences = 0, observed = 0;
  for (const std::string& path : kCifFiles) {
    SCOPED_TRACE(path);
    const size_t n = ref.index("cif", path);
    const Structure s = read_structure(path);  // by the name: mmCIF
    const json expected = read_json(ref.output(n, ".json"));
    EXPECT_EQ(s.num_models, expected["models"].get<int>());
    compare_with_tsv(s, ref.output(n, ".tsv"), d, false);  // both parse the same decimal text
    if (HasFatalFailure()) return;
    for (const Chain& chain : s.chains) {
      if (!expected["sequences"].contains(chain.id)) {
        EXPECT_TRUE(chain.sequence.empty()) << chain.id;
        continue;
      }
      const json& e = expected["sequences"][chain.id];
      EXPECT_EQ(chain.sequence, e["names"].get<std::vector<std::string>>()) << chain.id;
      const auto seen = e["observed"].get<std::vector<bool>>();
      ASSERT_EQ(chain.sequence_to_residue.size(), seen.size());
      for (size_t j = 0; j < seen.size(); ++j) {
        EXPECT_EQ(chain.sequence_to_residue[j] >= 0, bool(seen[j])) << chain.id << " position " << j;
        if (chain.sequence_to_residue[j] >= 0) {
          EXPECT_EQ(chain.residues[size_t(chain.sequence_to_residue[j])].name, chain.sequence[j]);
        }
        observed += seen[j];
      }
      ++sequences;
    }
  }
  std::cout << "mmCIF: " << kCifFiles.size() << " files, " << d.atoms << " atoms as biotite's CIF reader gives them"
            << " (max difference: coordinates " << d.coordinates << " Å, B-factor " << d.b_factor << "); "
            << sequences << " chain sequences, " << observed << " positions observed as _pdbx_poly_seq_scheme says\n";
  EXPECT_EQ(d.coordinates, 0.0);
  EXPECT_GE(sequences, 40u);
}

// biotite writes PDB files as mmCIF (every model); we read both and get the same structure.
TEST(StructureFilesTest, MmcifWrittenByBiotiteMatchesItsPdb) {
  const Reference& ref = reference();
  for (const std::string& path : {kLdhInsertions, kLdhMse, kNmr}) {
    SCOPED_TRACE(path);
    const Structure from_pdb = read_pdb(path);
    const Structure from_cif = read_mmcif(ref.output(ref.index("convert", path), ".cif").string());
    EXPECT_EQ(from_cif.num_models, from_pdb.num_models);
    ASSERT_EQ(from_cif.chains.size(), from_pdb.chains.size());
    double worst = 0;
    for (size_t c = 0; c < from_pdb.chains.size(); ++c) {
      const Chain &a = from_pdb.chains[c], &b = from_cif.chains[c];
      EXPECT_EQ(a.id, b.id);
      ASSERT_EQ(a.residues.size(), b.residues.size());
      for (size_t r = 0; r < a.residues.size(); ++r) {
        EXPECT_EQ(a.residues[r].name, b.residues[r].name);
        EXPECT_EQ(a.residues[r].number, b.residues[r].number);
        EXPECT_EQ(a.residues[r].insertion_code, b.residues[r].insertion_code);
        EXPECT_EQ(a.residues[r].hetero, b.residues[r].hetero);
        ASSERT_EQ(a.residues[r].atoms.size(), b.residues[r].atoms.size());
        for (size_t k = 0; k < a.residues[r].atoms.size(); ++k) {
          EXPECT_EQ(a.residues[r].atoms[k].name, b.residues[r].atoms[k].name);
          for (int x = 0; x < 3; ++x) {
            worst = std::max(worst, std::abs(a.residues[r].atoms[k].position[size_t(x)] -
                                             b.residues[r].atoms[k].position[size_t(x)]));
          }
        }
      }
    }
    EXPECT_LE(worst, 1e-6);  // biotite writes back the file's 3 decimals
  }
}

TEST(StructureFilesTest, ManyFilesSkipBadOnesUpToALimit) {
  const std::vector<std::string> paths = pdb_files();
  const FileBatch<Structure> batch = read_files<Structure>(paths, 2, read_structure);
  EXPECT_EQ(batch.read.size(), paths.size() - 2);
  ASSERT_EQ(batch.skipped.size(), 2u);
  EXPECT_CONTAINS(batch.skipped[0], "pdb1tw7_step3_charmm2namd_doubled_hex.pdb:33139: expected a residue number (an "
                                    "integer, hybrid-36 past 9999) in columns 23-26, found '271a'");
  EXPECT_CONTAINS(batch.skipped[1], "pdb2nwl-opm.pdb:");
  EXPECT_CONTAINS(batch.skipped[1], "expected a number for the B-factor in columns 61-66");
  const std::string over = testing::expected_error([&] { read_files<Structure>(paths, 1, read_structure); });
  EXPECT_CONTAINS(over, "2 bad files among the first ");
  EXPECT_CONTAINS(over, "more than max_bad_files = 1:\n  ");
  EXPECT_CONTAINS(over, "pdb2nwl-opm.pdb:");
}

// --- hand-made PDB files ---

// An ATOM/HETATM line in PDB's columns.
std::string atom_line(const char* record, int serial, const char* name, char altloc, const char* residue, char chain,
                      int number, char icode, double x, double y, double z, double occupancy, double b,
                      const char* element) {
  char line[96];
  std::snprintf(line, sizeof line, "%-6s%5d %-4s%c%3s %c%4d%c   %8.3f%8.3f%8.3f%6.2f%6.2f          %2s  \n", record,
                serial, name, altloc, residue, chain, number, icode, x, y, z, occupancy, b, element);
  return line;
}

TEST(StructureFilesTest, AltlocsKeepTheHighestOccupancyTheFirstOnTies) {
  std::string pdb;
  pdb += atom_line("ATOM", 1, " N", ' ', "SER", 'A', 1, ' ', 1, 0, 0, 1.0, 10, "N");
  pdb += atom_line("ATOM", 2, " CA", 'A', "SER", 'A', 1, ' ', 2, 0, 0, 0.4, 11, "C");
  pdb += atom_line("ATOM", 3, " CA", 'B', "SER", 'A', 1, ' ', 3, 0, 0, 0.6, 12, "C");  // higher: kept
  pdb += atom_line("ATOM", 4, " OG", 'A', "SER", 'A', 1, ' ', 4, 0, 0, 0.5, 13, "O");  // tie: the first
  pdb += atom_line("ATOM", 5, " OG", 'B', "SER", 'A', 1, ' ', 5, 0, 0, 0.5, 14, "O");
  // Microheterogeneity: an alternative residue at the same place is dropped; an atom without altloc stays.
  pdb += atom_line("ATOM", 6, " N", ' ', "PRO", 'A', 2, ' ', 6, 0, 0, 1.0, 15, "N");
  pdb += atom_line("ATOM", 7, " CA", 'A', "PRO", 'A', 2, ' ', 7, 0, 0, 0.5, 16, "C");
  pdb += atom_line("ATOM", 8, " CA", 'B', "LEU", 'A', 2, ' ', 8, 0, 0, 0.5, 17, "C");
  pdb += atom_line("ATOM", 9, " CD1", 'B', "LEU", 'A', 2, ' ', 9, 0, 0, 0.5, 18, "C");
  const Structure s = parse_pdb(pdb, "altlocs.pdb");
  ASSERT_EQ(s.chains.size(), 1u);
  const auto& residues = s.chains[0].residues;
  ASSERT_EQ(residues.size(), 2u);
  ASSERT_EQ(residues[0].atoms.size(), 3u);
  EXPECT_EQ(residues[0].atoms[1].name, "CA");
  EXPECT_EQ(residues[0].atoms[1].position[0], 3.0);
  EXPECT_EQ(residues[0].atoms[1].occupancy, 0.6);
  EXPECT_EQ(residues[0].atoms[2].position[0], 4.0);
  EXPECT_EQ(residues[1].name, "PRO");
  ASSERT_EQ(residues[1].atoms.size(), 2u);
  EXPECT_EQ(residues[1].atoms[1].position[0], 7.0);
}

TEST(StructureFilesTest, InsertionCodesMseModelsAndHetatm) {
  std::string pdb = "HEADER    HAND-MADE\nMODEL        1\n";
  pdb += atom_line("ATOM", 1, " CA", ' ', "GLY", 'A', 52, ' ', 1, 1, 1, 1, 20, "C");
  pdb += atom_line("ATOM", 2, " CA", ' ', "ALA", 'A', 52, 'A', 2, 1, 1, 1, 20, "C");
  pdb += atom_line("ATOM", 3, " CA", ' ', "ALA", 'A', 52, 'B', 3, 1, 1, 1, 20, "C");
  pdb += atom_line("HETATM", 4, " CA", ' ', "MSE", 'A', 53, ' ', 4, 1, 1, 1, 20, "C");
  pdb += atom_line("HETATM", 5, "SE", ' ', "MSE", 'A', 53, ' ', 5, 1, 1, 1, 20, "SE");
  pdb += "TER       6      MSE A  53\n";
  pdb += atom_line("ATOM", 7, " CA", ' ', "LYS", 'B', 1, ' ', 7, 1, 1, 1, 20, "C");
  pdb += atom_line("HETATM", 8, " O", ' ', "HOH", 'A', 301, ' ', 8, 1, 1, 1, 20, "O");   // water: dropped
  pdb += atom_line("HETATM", 9, " S", ' ', "SO4", 'A', 302, ' ', 9, 1, 1, 1, 20, "S");   // ligand of A
  pdb += atom_line("HETATM", 10, "ZN", ' ', "ZN", 'B', 401, ' ', 10, 1, 1, 1, 20, "");  // element guessed
  pdb += "ENDMDL\nMODEL        2\n";
  pdb += atom_line("ATOM", 1, " CA", ' ', "GLY", 'A', 52, ' ', -1, -1, -1, 1, 20, "C");
  pdb += "ENDMDL\nEND\n";
  const Structure s = parse_pdb(pdb, "hand.pdb");
  EXPECT_EQ(s.num_models, 2);
  ASSERT_EQ(s.chains.size(), 2u);
  const Chain& a = *s.chain("A");
  ASSERT_EQ(a.residues.size(), 5u);
  const char codes[] = {' ', 'A', 'B', ' '};
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(a.residues[r].number, r < 3 ? 52 : 53);
    EXPECT_EQ(a.residues[r].insertion_code, codes[r]);
    EXPECT_EQ(a.residues[r].atoms[0].position[0], double(r + 1));  // the first model's
  }
  const Residue& met = a.residues[3];
  EXPECT_EQ(met.name, "MET");
  EXPECT_FALSE(met.hetero);
  ASSERT_EQ(met.atoms.size(), 2u);
  EXPECT_EQ(met.atoms[1].name, "SD");
  EXPECT_EQ(met.atoms[1].element, "SE");
  EXPECT_EQ(a.residues[4].name, "SO4");
  EXPECT_TRUE(a.residues[4].hetero);
  const Chain& b = *s.chain("B");
  ASSERT_EQ(b.residues.size(), 2u);
  EXPECT_EQ(b.residues[1].atoms[0].element, "ZN");
  EXPECT_EQ(s.chain("C"), nullptr);
  EXPECT_TRUE(a.sequence.empty());
  std::string letters;
  for (const Residue& r : a.residues) letters += one_letter_code(r.name);
  EXPECT_EQ(letters, "GAAMX");
}

// SEQRES positions go to the residues with coordinates; where two places fit ("GLY GLY"), the one
// the numbering agrees with.
TEST(StructureFilesTest, SeqresFollowsTheNumbering) {
  std::string pdb = "SEQRES   1 A    6  MET GLY GLY SER MSE ALA\n";
  pdb += atom_line("ATOM", 1, " CA", ' ', "GLY", 'A', 3, ' ', 1, 1, 1, 1, 20, "C");
  pdb += atom_line("ATOM", 2, " CA", ' ', "SER", 'A', 4, ' ', 2, 1, 1, 1, 20, "C");
  pdb += atom_line("ATOM", 3, " CA", ' ', "ALA", 'A', 6, ' ', 3, 1, 1, 1, 20, "C");
  pdb += atom_line("HETATM", 4, " C1", ' ', "GOL", 'A', 7, ' ', 4, 1, 1, 1, 20, "C");
  const Structure s = parse_pdb(pdb, "seqres.pdb");
  const Chain& a = s.chains[0];
  EXPECT_EQ(a.sequence, (std::vector<std::string>{"MET", "GLY", "GLY", "SER", "MET", "ALA"}));
  EXPECT_EQ(a.sequence_to_residue, (std::vector<int>{-1, -1, 0, 1, -1, 2}));

  const std::string wrong = testing::expected_error([] { parse_pdb("SEQRES   1 A    3  MET GLY\n" + atom_line("ATOM", 1, " CA", ' ',
                                        "MET", 'A', 1, ' ', 1, 1, 1, 1, 20, "C"), "count.pdb"); });
  EXPECT_CONTAINS(wrong, "count.pdb:1: the SEQRES records of chain 'A' list 2 residues, but their count");
}

// A file cut short, a coordinate that is not a number: the error names the file, the line, the
// columns, what was expected and what was found.
TEST(StructureFilesTest, BadPdbLinesNameFileAndLine) {
  const fs::path dir = testing::temp_dir("bad_pdb");
  const std::string text = read_text_file(kLdhInsertions);
  const size_t line_start = text.find("\nATOM", text.size() / 2) + 1;
  const size_t line = size_t(std::count(text.begin(), text.begin() + long(line_start), '\n')) + 1;

  const fs::path cut = dir / "cut.pdb";
  std::ofstream(cut) << text.substr(0, line_start + 40);  // inside the y coordinate
  const std::string cut_error = testing::expected_error([&] { read_pdb(cut.string()); });
  EXPECT_CONTAINS(cut_error, cut.string() + ":" + std::to_string(line) +
                                 ": expected an ATOM record through column 66 (the B-factor), but the line ends at "
                                 "column 40");

  std::string garbled = text;
  garbled[line_start + 33] = 'x';  // column 34, inside x
  const fs::path bad = dir / "garbled.pdb";
  std::ofstream(bad) << garbled;
  const std::string bad_error = testing::expected_error([&] { read_pdb(bad.string()); });
  EXPECT_CONTAINS(bad_error, bad.string() + ":" + std::to_string(line) +
                                 ": expected a number for the x coordinate in columns 31-38, found '" +
                                 garbled.substr(line_start + 30, 8) + "'");

  EXPECT_CONTAINS(testing::expected_error([&] { read_pdb((dir / "absent.pdb").string()); }), "absent.pdb");
  std::ofstream(dir / "empty.pdb") << "HEADER    NOTHING\n";
  EXPECT_CONTAINS(testing::expected_error([&] { read_pdb((dir / "empty.pdb").string()); }), "empty.pdb: no ATOM or HETATM records");
  fs::remove_all(dir);
}

bool same_structure(const Structure& a, const Structure& b, double tolerance, double& worst) {
  if (a.chains.size() != b.chains.size()) return false;
  for (size_t c = 0; c < a.chains.size(); ++c) {
    const Chain &x = a.chains[c], &y = b.chains[c];
    if (x.id != y.id || x.residues.size() != y.residues.size() || x.sequence != y.sequence ||
        x.sequence_to_residue != y.sequence_to_residue) {
      return false;
    }
    for (size_t r = 0; r < x.residues.size(); ++r) {
      const Residue &p = x.residues[r], &q = y.residues[r];
      if (p.name != q.name || p.number != q.number || p.insertion_code != q.insertion_code || p.hetero != q.hetero ||
          p.atoms.size() != q.atoms.size()) {
        return false;
      }
      for (size_t k = 0; k < p.atoms.size(); ++k) {
        if (p.atoms[k].name != q.atoms[k].name || p.atoms[k].element != q.atoms[k].element) return false;
        for (int i = 0; i < 3; ++i) {
          worst = std::max(worst, std::abs(p.atoms[k].position[size_t(i)] - q.atoms[k].position[size_t(i)]));
        }
        worst = std::max({worst, std::abs(p.atoms[k].occupancy - q.atoms[k].occupancy),
                          std::abs(p.atoms[k].b_factor - q.atoms[k].b_factor)});
      }
    }
  }
  return worst <= tolerance;
}

// Written and read back: the same structure, coordinates as the 3 decimals PDB holds; the B-factor
// column carries what the caller puts there.
TEST(StructureFilesTest, WriteThenReadGivesTheSameStructure) {
  const fs::path dir = testing::temp_dir("round_trip");
  size_t files = 0, atoms = 0;
  double worst = 0;
  for (const std::string& path : files_in(kTheseus, {".pdb.gz"})) {
    SCOPED_TRACE(path);
    const Structure read = read_pdb(path);
    const Structure again = parse_pdb(format_pdb(read), path + " written");
    EXPECT_TRUE(same_structure(read, again, 0.0, worst)) << "max difference " << worst;  // they had 3 decimals
    EXPECT_EQ(format_pdb(again), format_pdb(read));
    ++files;
    atoms += count_atoms(read);
  }
  // Coordinates with more decimals, and pLDDT-like values in the B-factor column.
  Structure s = read_pdb(kLdhMse);
  double moved = 0;
  for (Chain& c : s.chains) {
    for (Residue& r : c.residues) {
      for (Atom& a : r.atoms) {
        for (double& x : a.position) x += 0.0001234;
        a.b_factor = 0.5 + r.number % 50;
      }
    }
  }
  write_pdb(s, (dir / "back.pdb").string());
  const Structure back = read_pdb((dir / "back.pdb").string());
  EXPECT_TRUE(same_structure(s, back, 0.0005, moved)) << moved;
  EXPECT_GE(files, 400u);  // theseus-examples
  std::cout << "write -> read: " << files << " files, " << atoms << " atoms, max difference " << worst
            << " Å; with 7 decimals: " << moved << " Å\n";

  Structure wide = s;
  wide.chains[0].residues[0].atoms[0].position[0] = 12345.0;
  EXPECT_CONTAINS(testing::expected_error([&] { format_pdb(wide); }), "cannot write coordinate 12345");
  Structure long_id = s;
  long_id.chains[0].id = "AB";
  EXPECT_CONTAINS(testing::expected_error([&] { format_pdb(long_id); }), "cannot write chain id 'AB'");
  fs::remove_all(dir);
}

// --- mmCIF ---

const char kSmallCif[] = R"(data_TEST
# a comment; the next item is a text field
_struct.title
;A title over
two lines
;
_struct.pdbx_descriptor   'it's quoted'
_exptl.method "X-RAY DIFFRACTION"
loop_
_entity_poly_seq.entity_id
_entity_poly_seq.num
_entity_poly_seq.mon_id
1 1 MET 1 2 GLY 1 3 MSE
1 4 SER
loop_
_struct_asym.id
_struct_asym.entity_id
C 1
D 2
loop_
_atom_site.group_PDB
_atom_site.type_symbol
_atom_site.label_atom_id
_atom_site.label_alt_id
_atom_site.label_comp_id
_atom_site.label_asym_id
_atom_site.label_entity_id
_atom_site.label_seq_id
_atom_site.pdbx_PDB_ins_code
_atom_site.Cartn_x
_atom_site.Cartn_y
_atom_site.Cartn_z
_atom_site.occupancy
_atom_site.B_iso_or_equiv
_atom_site.auth_seq_id
_atom_site.auth_asym_id
_atom_site.pdbx_PDB_model_num
ATOM   N  N   . GLY C 1 2 ? 1.0 2.0 3.0 1.0 10.0 102 A 1
ATOM   C  CA  A GLY C 1 2 ? 2.0 2.0 3.0 0.3 11.0 102 A 1
ATOM   C  CA  B GLY C 1 2 ? 3.0 2.0 3.0 0.7 12.0 102 A 1
HETATM SE SE  . MSE C 1 3 A 4.0 2.0 3.0 1.0 13.0 102 A 1
HETATM C  "C1'" . LIG D 2 . ? 5.0 2.0 3.0 1.0 14.0 201 A 1
HETATM O  O   . HOH E 3 . ? 6.0 2.0 3.0 1.0 15.0 301 A 1
ATOM   N  N   . GLY C 1 2 ? 9.0 9.0 9.0 1.0 10.0 102 A 2
)";

TEST(StructureFilesTest, MmcifSyntaxAndIds) {
  const CifBlock block = parse_cif(kSmallCif, "small.cif");
  EXPECT_EQ(block.name(), "TEST");
  EXPECT_EQ((*block.find("_struct.title"))[0], "A title over\ntwo lines");
  EXPECT_EQ((*block.find("_STRUCT.PDBX_DESCRIPTOR"))[0], "it's quoted");
  EXPECT_EQ(block.find("_exptl.method")->line(0), 8u);
  const CifColumn& mon = *block.find("_entity_poly_seq.mon_id");
  ASSERT_EQ(mon.size(), 4u);
  EXPECT_EQ(mon[3], "SER");
  EXPECT_EQ(mon.line(3), 14u);
  EXPECT_TRUE(block.find("_atom_site.pdbx_PDB_ins_code")->is_null(0));
  EXPECT_EQ(block.find("_atom_site.label_atom_id")->raw(4), "C1'");
  EXPECT_EQ(block.find("_nothing.here"), nullptr);

  // Chains and numbers are the author's (auth_asym_id A, auth_seq_id 102), not label_asym_id C and
  // label_seq_id 2; the sequence comes from _entity_poly_seq through _struct_asym.
  const Structure s = parse_mmcif(kSmallCif, "small.cif");
  EXPECT_EQ(s.num_models, 2);
  ASSERT_EQ(s.chains.size(), 1u);
  const Chain& a = s.chains[0];
  EXPECT_EQ(a.id, "A");
  ASSERT_EQ(a.residues.size(), 3u);
  EXPECT_EQ(a.residues[0].name, "GLY");
  EXPECT_EQ(a.residues[0].number, 102);
  ASSERT_EQ(a.residues[0].atoms.size(), 2u);
  EXPECT_EQ(a.residues[0].atoms[1].position[0], 3.0);  // altloc B: occupancy 0.7
  EXPECT_EQ(a.residues[1].name, "MET");
  EXPECT_EQ(a.residues[1].insertion_code, 'A');
  EXPECT_EQ(a.residues[1].atoms[0].name, "SD");
  EXPECT_EQ(a.residues[2].atoms[0].name, "C1'");
  EXPECT_EQ(a.sequence, (std::vector<std::string>{"MET", "GLY", "MET", "SER"}));
  EXPECT_EQ(a.sequence_to_residue, (std::vector<int>{-1, 0, 1, -1}));
}

TEST(StructureFilesTest, BadMmcifNamesFileAndLine) {
  const std::pair<std::string, std::string> cases[] = {
      {"data_X\n_a.b 'open\n", "bad.cif:2: unterminated quoted value: expected a closing ' before the end"},
      {"data_X\n_a.b\n;never closed\n", "bad.cif:3: a text field opens here"},
      {"data_X\nloop_\n_a.b\n_a.c\n1 2 3\n", "bad.cif:2: the loop_ that starts here has 2 tags, but its 3 values"},
      {"data_X\n_a.b 1\n_a.b 2\n", "bad.cif:3: _a.b is given twice (first at line 2)"},
      {"data_X\n_a.b\n_a.c 1\n", "bad.cif:2: expected a value for _a.b"},
      {"_a.b 1\n", "bad.cif:1: expected data_ before '_a.b'"},
      {"data_X\n_a.b 1\n", "bad.cif: no _atom_site loop (data_X)"},
  };
  for (const auto& [text, expected] : cases) EXPECT_CONTAINS(testing::expected_error([&] { parse_mmcif(text, "bad.cif"); }), expected);
  std::string garbled = kSmallCif;
  garbled.replace(garbled.find("3.0 0.7"), 3, "3.x");
  EXPECT_CONTAINS(testing::expected_error([&] { parse_mmcif(garbled, "garbled.cif"); }),
                  "garbled.cif:40: expected a number for _atom_site.Cartn_z (atom 3), found '3.x'");
  // A real file cut short inside the atoms.
  const std::string text = read_text_file(kCifFiles[0]);
  const size_t cut = text.find("\nATOM", text.size() / 2) + 20;
  const size_t line = size_t(std::count(text.begin(), text.begin() + long(cut), '\n')) + 1;
  const std::string message = testing::expected_error([&] { parse_mmcif(text.substr(0, cut), "cut.cif"); });
  EXPECT_CONTAINS(message, "the loop_ that starts here has 21 tags");
  EXPECT_CONTAINS(message, "the values end at line " + std::to_string(line));
}

// --- alignments ---

// AlphaFold's parse_a3m, by hand: an uppercase letter or '-' is a column and takes the count of
// lowercase letters (insertions) since the previous column; insertions after the last column count
// for nothing. Worked example (query MKVL):
//   "MkkKVL"  -> MKVL, [0, 2, 0, 0]   (kk inserted before K)
//   "-K-Lqr"  -> -K-L, [0, 0, 0, 0]   (qr after the last column)
//   "aMKbVcL" -> MKVL, [1, 0, 1, 1]
const char kA3m[] = ">query the query\nMKVL\n>s1\nMkkKVL\n>s2 second\n-K-L\nqr\n\n>s3\naMKbVcL\n";
const std::vector<std::string> kAligned = {"MKVL", "MKVL", "-K-L", "MKVL"};
const std::vector<std::vector<int>> kDeletions = {{0, 0, 0, 0}, {0, 2, 0, 0}, {0, 0, 0, 0}, {1, 0, 1, 1}};

TEST(StructureFilesTest, A3mAndA2mDeletionMatrices) {
  const Msa a3m = parse_a3m(kA3m, "hand.a3m");
  EXPECT_EQ(a3m.sequences, kAligned);
  EXPECT_EQ(a3m.deletion_matrix, kDeletions);
  EXPECT_EQ(a3m.descriptions, (std::vector<std::string>{"query the query", "s1", "s2 second", "s3"}));
  // The same alignment as a2m: '.' fills the insert columns, so every row is 9 long as written.
  const char a2m_text[] = ">query\n.M..KVL..\n>s1\n.MkkKVL..\n>s2\n.-..K-Lqr\n>s3\naM..KbVcL\n";
  const Msa a2m = parse_a2m(a2m_text, "hand.a2m");
  EXPECT_EQ(a2m.sequences, kAligned);
  EXPECT_EQ(a2m.deletion_matrix, kDeletions);

  EXPECT_CONTAINS(testing::expected_error([] { parse_a2m(">q\n.MKVL\n>s\nMKVL\n", "short.a2m"); }),
                  "short.a2m:3: expected an a2m row of 5 characters (as the query's), found 4");
  EXPECT_CONTAINS(testing::expected_error([] { parse_a3m(">q\nMKVL\n>s\nMKV\n", "short.a3m"); }),
                  "short.a3m:3: expected 4 aligned columns (as the query: uppercase letters and '-'), found 3");
  EXPECT_CONTAINS(testing::expected_error([] { parse_a3m("MKVL\n>s\nMKV\n", "headless.a3m"); }),
                  "headless.a3m:1: expected a '>' header before the first sequence line");
  EXPECT_CONTAINS(testing::expected_error([] { parse_fasta(">q\nMK1VL\n", "digit.fasta"); }),
                  "digit.fasta:2: expected residues (letters, '-', '.', '*'), found '1' at character 3");
  EXPECT_CONTAINS(testing::expected_error([] { parse_fasta("\n\n", "empty.fasta"); }), "empty.fasta: expected sequences");
}

// AlphaFold's parse_stockholm, by hand: the query's gap columns go, and each residue of another row in
// such a column counts as a deletion before the next kept column. Worked example:
//   query  M-KV.L   keeps columns 0, 2, 3, 5 -> MKVL
//   hit1   MaK-cL   -> MK-L, [0, 1, 0, 1]  ('a' in column 1, 'c' in column 4)
//   hit2   .-K.-L   -> -K-L, [0, 0, 0, 0]  ('.' kept as a gap is written '-')
TEST(StructureFilesTest, StockholmByAlphaFoldsRules) {
  const char text[] =
      "# STOCKHOLM 1.0\n#=GF ID  hand\n#=GS hit1 DE a hit\n#=GS hit1 AC P12345\n\n"
      "query  M-K\nhit1   MaK\nhit2   .-K\n#=GC SS_cons HHH\n\n"
      "query  V.L\nhit1   -cL\nhit2   .-L\n#=GR hit1 SS ...\n#=GC SS_cons EEE\n//\n";
  const Msa msa = parse_stockholm(text, "hand.sto");
  EXPECT_EQ(msa.sequences, (std::vector<std::string>{"MKVL", "MK-L", "-K-L"}));
  EXPECT_EQ(msa.deletion_matrix, (std::vector<std::vector<int>>{{0, 0, 0, 0}, {0, 1, 0, 1}, {0, 0, 0, 0}}));
  EXPECT_EQ(msa.descriptions, (std::vector<std::string>{"query", "hit1 a hit", "hit2"}));
  EXPECT_EQ(msa.column_annotations.at("SS_cons"), "HHEE");

  const std::string cut(text, sizeof text - 4);
  EXPECT_CONTAINS(testing::expected_error([&] { parse_stockholm(cut, "cut.sto"); }),
                  "cut.sto:15: expected '//' to close the alignment, but the file ends here");
  EXPECT_CONTAINS(testing::expected_error([] { parse_stockholm("# STOCKHOLM 1.0\nq MKV\nh MK\n//\n", "uneven.sto"); }),
                  "uneven.sto:3: expected the row of h to be 3 columns long (as the query's), found 2");
  EXPECT_CONTAINS(testing::expected_error([] { parse_stockholm(">q\nMKV\n", "fasta.sto"); }),
                  "fasta.sto:1: expected '# STOCKHOLM 1.0', found '>q'");
  EXPECT_CONTAINS(testing::expected_error([] { parse_stockholm("# STOCKHOLM 1.0\nq M K V\n//\n", "split.sto"); }),
                  "split.sto:2: expected '<name> <aligned sequence>'");
}

TEST(StructureFilesTest, FastaMatchesBiotite) {
  const Reference& ref = reference();
  size_t sequences = 0;
  for (const std::string& path : fasta_files()) {
    SCOPED_TRACE(path);
    const Msa msa = read_alignment(path, AlignmentFormat::kFasta);
    const json expected = read_json(ref.output(ref.index("fasta", path), ".json"));
    EXPECT_EQ(msa.descriptions, expected["descriptions"].get<std::vector<std::string>>());
    EXPECT_EQ(msa.sequences, expected["sequences"].get<std::vector<std::string>>());
    for (size_t i = 0; i < msa.size(); ++i) EXPECT_EQ(msa.deletion_matrix[i], std::vector<int>(msa.sequences[i].size()));
    sequences += msa.size();
  }
  std::cout << "FASTA: " << fasta_files().size() << " files, " << sequences << " sequences as biotite reads them\n";
}

// Removes the 0-based lines `from`..`to` of a file's text.
std::string without_lines(const std::string& text, size_t from, size_t to) {
  std::istringstream in(text);
  std::string out, line;
  for (size_t n = 0; std::getline(in, line); ++n) {
    if (n < from || n > to) out += line + "\n";
  }
  return out;
}

// Pfam's Cys_knot alignment in Stockholm against the same alignment in FASTA (prody's test files): each
// row is its FASTA row without the query's gap columns, and keeps every residue, aligned or deleted.
// Both files repeat their first sequence: the Stockholm reader refuses that (AlphaFold's would join
// the two into one row twice the length); without the repeat they are read.
TEST(StructureFilesTest, StockholmMatchesItsFasta) {
  const std::string sto_path = (kProdyData / "msa_Cys_knot.sth").string();
  EXPECT_CONTAINS(testing::expected_error([&] { read_alignment(sto_path); }),
                  sto_path + ":53: expected each name once in a block, but GTHB2_ONCKE/26-130 is here again (also at "
                             "line 52)");
  const Msa sto = parse_stockholm(without_lines(read_text_file(sto_path), 52, 52), "msa_Cys_knot.sth");
  const Msa fasta = parse_fasta(without_lines(read_text_file((kProdyData / "msa_Cys_knot.fasta").string()), 0, 2),
                                "msa_Cys_knot.fasta");
  ASSERT_EQ(sto.size(), fasta.size());
  const std::string& query = fasta.sequences[0];
  size_t columns = 0, deleted = 0;
  for (size_t i = 0; i < sto.size(); ++i) {
    EXPECT_EQ(sto.descriptions[i], fasta.descriptions[i]);
    std::string kept;
    for (size_t c = 0; c < query.size(); ++c) {
      if (query[c] != '-' && query[c] != '.') kept += fasta.sequences[i][c] == '.' ? '-' : fasta.sequences[i][c];
    }
    EXPECT_EQ(sto.sequences[i], kept);
    auto residues = [](const std::string& s) {
      return size_t(std::count_if(s.begin(), s.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); }));
    };
    const int row_deleted = std::accumulate(sto.deletion_matrix[i].begin(), sto.deletion_matrix[i].end(), 0);
    EXPECT_EQ(residues(fasta.sequences[i]), residues(sto.sequences[i]) + size_t(row_deleted)) << i;
    deleted += size_t(row_deleted);
    columns = sto.sequences[i].size();
  }
  EXPECT_EQ(sto.column_annotations.at("SS_cons").size(), columns);
  std::cout << "Stockholm: " << sto.size() << " rows of " << columns << " query columns, " << deleted
            << " residues deleted; t-coffee's Stockholm files:";
  for (const std::string& path : files_in(kTCoffee, {".stk", ".stk.gz"})) {
    const Msa msa = read_alignment(path);
    EXPECT_GE(msa.size(), 1u) << path;
    EXPECT_EQ(msa.column_annotations.at("SS_cons").size(), msa.sequences[0].size()) << path;
    std::cout << " " << fs::path(path).filename().string() << " (" << msa.size() << " rows)";
  }
  std::cout << "\n";
  EXPECT_GT(deleted, 0u);
}

TEST(StructureFilesTest, AlignmentFormatsByName) {
  EXPECT_EQ(alignment_format("x/uniref90_hits.sto"), AlignmentFormat::kStockholm);
  EXPECT_EQ(alignment_format("bfd_uniclust_hits.a3m"), AlignmentFormat::kA3m);
  EXPECT_EQ(alignment_format("seq.fasta.gz"), AlignmentFormat::kFasta);
  EXPECT_EQ(alignment_format("hits.a2m"), AlignmentFormat::kA2m);
  EXPECT_CONTAINS(testing::expected_error([] { alignment_format("notes.txt"); }), "notes.txt: unknown alignment format");

  const fs::path dir = testing::temp_dir("alignments");
  std::ofstream(dir / "good.a3m") << kA3m;
  std::ofstream(dir / "bad.a3m") << ">q\nMKVL\n>s\nMK\n";
  const std::vector<std::string> paths = {(dir / "good.a3m").string(), (dir / "bad.a3m").string(),
                                          (dir / "good.a3m").string()};
  const FileBatch<Msa> batch = read_files<Msa>(paths, 1, [](const std::string& p) { return read_alignment(p); });
  EXPECT_EQ(batch.read.size(), 2u);
  ASSERT_EQ(batch.skipped.size(), 1u);
  EXPECT_CONTAINS(batch.skipped[0], "bad.a3m:3:");
  EXPECT_CONTAINS(testing::expected_error([&] { read_files<Msa>(paths, 0, [](const std::string& p) { return read_alignment(p); }); }),
                  "1 bad files among the first 2 of 3, more than max_bad_files = 0:\n  " + paths[1] + ":3:");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kuafu::fold
