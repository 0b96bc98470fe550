// ProMod3's structure database (Debian's promod3-data: 21,119 PDB chains), read without ProMod3: per chain
// its PDB id, sequence, backbone N/CA/C/O in the PDB entry's frame, DSSP states, phi/psi and profiles.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace kuafu::fold {

// The file Debian ships is StructureDB::Save's raw format, which StructureDB::Load reads (LoadPortable
// refuses it: its portable format stores other type sizes). Every value is little endian:
//   header   uint32 magic 1234, uint32 version 2, 12 uint32 type sizes (4 4 2 8 2 6 88 40 24 6 4 1),
//            check values float 1.0, uint8 1, uint16 1, uint64 1, int16 1: 73 bytes;
//   int32    stored data: which optional sections follow (StructureDbData; -1: all);
//   uint64   chain count, then per chain: uint32 length + PDB id, uint32 length + chain name,
//            uint32 index of its first residue, uint16 residue count, uint16 first residue number,
//            float[3] shift;
//   sections, each a uint64 residue count and one record a residue, in this order:
//            sequence char; backbone uint16[4][3] (N, CA, C, O in 0.01 Å, PDB coordinates + shift:
//            ProMod3 shifts each chain to its corner at 0 to store them unsigned);
//            then as stored: phi/psi int16[2] in 0.001 rad, solvent accessibility uint16 (Å²),
//            residue depth uint16 (0.1 Å), DSSP char, sequence profile (HHblits) int16[20],
//            structure profile int16[20] (frequencies × 10000).
inline constexpr char kDebianStructureDb[] = "/usr/share/promod3/loop_data/structure_db.dat";

// The optional sections (ProMod3's StructureDB::DBDataType bits).
enum class StructureDbData : int32_t {
  kDihedrals = 1,
  kSolventAccessibility = 2,
  kResidueDepth = 4,
  kDssp = 8,
  kSequenceProfile = 16,
  kStructureProfile = 32,
};

using Vec3f = std::array<float, 3>;

struct BackboneResidue {
  Vec3f n, ca, c, o;  // Å
};

// A profile column: frequencies of the 20 amino acids in kProfileOrder (ProMod3's, alphabetical codes).
using ProfileColumn = std::array<float, 20>;
inline constexpr char kProfileOrder[] = "ACDEFGHIKLMNPQRSTVWY";

// A chain as the table lists it: one contiguous stretch of residues (the database holds no gaps).
struct ChainRecord {
  std::string pdb_id;         // "12AS"
  std::string chain_name;     // "A"
  uint32_t offset = 0;        // index of its first residue among all the database's residues
  uint16_t size = 0;          // residues
  uint16_t start_resnum = 0;  // residue number of its first residue
  Vec3f shift{};              // what ProMod3 added to the PDB coordinates before storing them
};

// One chain decoded; a part the database lacks or that was not read is empty.
struct StructureChain {
  std::string pdb_id;
  std::string chain_name;
  int start_resnum = 0;
  std::string sequence;                       // one-letter codes
  std::string dssp;                           // DSSP states: H B E G I T S C
  std::vector<BackboneResidue> backbone;      // the PDB entry's frame (shift undone)
  std::vector<std::array<float, 2>> phi_psi;  // radians
};

// Which per-residue parts read_structure_db keeps in memory besides the chain table and sequences
// (4.6 M residues: backbone 24 bytes a residue, phi/psi 4, DSSP 1). Profiles are read on demand.
struct StructureDbParts {
  bool backbone = true;
  bool dihedrals = true;
  bool dssp = true;
};

class StructureDb {
 public:
  const std::string& path() const { return path_; }
  bool has(StructureDbData data) const;  // stored in the file (whether or not it was read)
  size_t num_chains() const { return records_.size(); }
  size_t num_residues() const { return sequence_.size(); }
  const std::vector<ChainRecord>& records() const { return records_; }

  StructureChain chain(size_t index) const;

  // Read from the file at each call (2 × 40 bytes a residue would triple the memory); throw when the
  // database has none.
  std::vector<ProfileColumn> sequence_profile(size_t index) const;
  std::vector<ProfileColumn> structure_profile(size_t index) const;

 private:
  friend StructureDb read_structure_db(const std::string& path, const StructureDbParts& parts);
  std::vector<ProfileColumn> profile(size_t index, uint64_t section, const char* what) const;
  const ChainRecord& record(size_t index) const;

  std::string path_;
  int32_t stored_ = 0;
  std::vector<ChainRecord> records_;
  std::string sequence_;             // all residues, chains one after another
  std::string dssp_;                 // empty when not read
  std::vector<uint16_t> backbone_;   // 12 a residue, as stored; empty when not read
  std::vector<int16_t> dihedrals_;   // 2 a residue, as stored; empty when not read
  uint64_t sequence_profiles_ = 0;   // byte offset of the section's first record; 0: none
  uint64_t structure_profiles_ = 0;
};

// Reads and checks the whole layout first: a wrong or truncated file throws kuafu::Error naming the file,
// what was expected and at which byte.
StructureDb read_structure_db(const std::string& path, const StructureDbParts& parts = {});

}  // namespace kuafu::fold
