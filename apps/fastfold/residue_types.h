// The 20 standard amino acids as AlphaFold 2 numbers them and names their atoms, and the ideal geometry of
// their rigid groups (supplement 1.8, Table 2) as measured in Debian's PDB files (data/ideal_residues.inc,
// written by data/ideal_residues.py). LibTorch-free: the readers and the data recipe use it too.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kuafu::fold {

constexpr int kResidueTypes = 20;  // aatype 0..19 in AlphaFold's order (by three-letter name); 20 is unknown
constexpr int kUnknownResidue = 20;
constexpr int kAtom14 = 14;        // a residue's heavy atoms, in its own order
constexpr int kAtom37 = 37;        // every heavy-atom name any standard residue uses, in one order
constexpr int kRigidGroups = 8;    // backbone, pre-omega, phi, psi, chi1..chi4
constexpr int kTorsions = 7;       // the angles of groups 1..7

struct ResidueType {
  char code;                                           // 'R'
  std::string name;                                    // "ARG"
  std::vector<std::string> atoms;                      // atom14 order: N, CA, C, O, then the side chain (the CCD's order)
  std::vector<std::array<std::string, 4>> chis;        // each chi angle's four atoms
  std::vector<std::pair<std::string, std::string>> swaps;  // atoms a symmetric side chain names either way
  int pi_periodic_chi = -1;                            // the chi angle those swaps turn by π, or -1
};

// One atom placed in its rigid group: `position` in the group's frame, Å (the group's axis atom at the
// origin, the x axis along the bond the group turns about, the atom defining the angle in the xy plane
// with y > 0; the backbone group: CA at the origin, C on x, N in the xy plane).
struct GroupedAtom {
  std::string name;
  int group = 0;  // 0 backbone (N, CA, C, CB), 3 psi (O), 4 + k the (k+1)-th chi angle
  std::array<double, 3> position{};
};

const std::array<ResidueType, kResidueTypes>& residue_types();
int residue_type_index(char code);  // 0..19, kUnknownResidue for anything else
const std::array<std::string, kAtom37>& atom37_names();
int atom37_index(std::string_view atom_name);  // -1 for a name not among them

// A residue type's atoms in atom14 order, each in its rigid group: the median place in real structures.
std::vector<GroupedAtom> ideal_grouped_atoms(const ResidueType& type);

// A rigid group's frame in its parent's before its torsion turns it (x -> rotation x + translation).
struct GroupFrame {
  std::array<std::array<double, 3>, 3> rotation{};  // rows
  std::array<double, 3> translation{};
};

// Each group's default frame (the literature frames of Algorithm 24): the backbone,
// pre-omega, phi and psi groups and chi1 in the backbone's frame, chi k+1 in chi k's; at a zero torsion
// the atom defining the angle lies cis to the atom before the axis. Identity for groups a type lacks.
std::array<GroupFrame, kRigidGroups> default_group_frames(const ResidueType& type, const std::vector<GroupedAtom>& atoms);

}  // namespace kuafu::fold
