#include "apps/fastfold/residue_types.h"

#include <algorithm>
#include <cmath>

#include "core/util/error.h"

namespace kuafu::fold {
namespace {

using Vec3 = std::array<double, 3>;

Vec3 minus(const Vec3& a, const Vec3& b) { return {a[0] - b[0], a[1] - b[1], a[2] - b[2]}; }
double dot(const Vec3& a, const Vec3& b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }
Vec3 scaled(const Vec3& a, double s) { return {a[0] * s, a[1] * s, a[2] * s}; }
Vec3 unit(const Vec3& a) { return scaled(a, 1.0 / std::sqrt(dot(a, a))); }
Vec3 cross(const Vec3& a, const Vec3& b) {
  return {a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]};
}

struct IdealAtom {
  const char* residue;
  const char* atom;
  int group;
  double x, y, z;
};

const IdealAtom kIdealAtoms[] = {
#include "apps/fastfold/data/ideal_residues.inc"
};

ResidueType make(char code, std::string name, std::vector<std::string> side_chain_chi_atoms,
                 std::vector<std::pair<std::string, std::string>> swaps = {}, int pi_periodic_chi = -1) {
  ResidueType type{code, name, {}, {}, std::move(swaps), pi_periodic_chi};
  for (const IdealAtom& atom : kIdealAtoms)
    if (name == atom.residue) type.atoms.push_back(atom.atom);
  // The chi angles run along the side chain's main branch: N, CA, then the atoms given.
  std::vector<std::string> chain = {"N", "CA"};
  chain.insert(chain.end(), side_chain_chi_atoms.begin(), side_chain_chi_atoms.end());
  for (size_t k = 0; k + 4 <= chain.size(); ++k) type.chis.push_back({chain[k], chain[k + 1], chain[k + 2], chain[k + 3]});
  return type;
}

}  // namespace

const std::array<ResidueType, kResidueTypes>& residue_types() {
  static const std::array<ResidueType, kResidueTypes> types = {
      make('A', "ALA", {}),
      make('R', "ARG", {"CB", "CG", "CD", "NE", "CZ"}),
      make('N', "ASN", {"CB", "CG", "OD1"}),
      make('D', "ASP", {"CB", "CG", "OD1"}, {{"OD1", "OD2"}}, 1),
      make('C', "CYS", {"CB", "SG"}),
      make('Q', "GLN", {"CB", "CG", "CD", "OE1"}),
      make('E', "GLU", {"CB", "CG", "CD", "OE1"}, {{"OE1", "OE2"}}, 2),
      make('G', "GLY", {}),
      make('H', "HIS", {"CB", "CG", "ND1"}),
      make('I', "ILE", {"CB", "CG1", "CD1"}),
      make('L', "LEU", {"CB", "CG", "CD1"}),
      make('K', "LYS", {"CB", "CG", "CD", "CE", "NZ"}),
      make('M', "MET", {"CB", "CG", "SD", "CE"}),
      make('F', "PHE", {"CB", "CG", "CD1"}, {{"CD1", "CD2"}, {"CE1", "CE2"}}, 1),
      make('P', "PRO", {"CB", "CG", "CD"}),
      make('S', "SER", {"CB", "OG"}),
      make('T', "THR", {"CB", "OG1"}),
      make('W', "TRP", {"CB", "CG", "CD1"}),
      make('Y', "TYR", {"CB", "CG", "CD1"}, {{"CD1", "CD2"}, {"CE1", "CE2"}}, 1),
      make('V', "VAL", {"CB", "CG1"}),
  };
  return types;
}

int residue_type_index(char code) {
  const auto& types = residue_types();
  for (int i = 0; i < kResidueTypes; ++i)
    if (types[i].code == code) return i;
  return kUnknownResidue;
}

const std::array<std::string, kAtom37>& atom37_names() {
  static const std::array<std::string, kAtom37> names = {
      "N",   "CA",  "C",   "CB",  "O",   "CG",  "CG1", "CG2", "OG",  "OG1", "SG",  "CD",  "CD1",
      "CD2", "ND1", "ND2", "OD1", "OD2", "SD",  "CE",  "CE1", "CE2", "CE3", "NE",  "NE1", "NE2",
      "OE1", "OE2", "CH2", "NH1", "NH2", "OH",  "CZ",  "CZ2", "CZ3", "NZ",  "OXT"};
  return names;
}

int atom37_index(std::string_view atom_name) {
  const auto& names = atom37_names();
  const auto found = std::find(names.begin(), names.end(), atom_name);
  return found == names.end() ? -1 : static_cast<int>(found - names.begin());
}

std::vector<GroupedAtom> ideal_grouped_atoms(const ResidueType& type) {
  std::vector<GroupedAtom> grouped;
  for (const IdealAtom& atom : kIdealAtoms)
    if (type.name == atom.residue) grouped.push_back({atom.atom, atom.group, {atom.x, atom.y, atom.z}});
  return grouped;
}

std::array<GroupFrame, kRigidGroups> default_group_frames(const ResidueType& type, const std::vector<GroupedAtom>& atoms) {
  const auto position = [&](const std::string& name) -> const Vec3& {
    for (const GroupedAtom& atom : atoms)
      if (atom.name == name) return atom.position;
    throw Error("no atom " + name + " among the grouped atoms of " + type.name);
  };
  // The frame at `origin` whose x axis runs along `x_axis` and whose xy plane holds `y_towards` (y > 0).
  const auto frame = [](const Vec3& x_axis, const Vec3& y_towards, const Vec3& origin) {
    const Vec3 e1 = unit(x_axis);
    const Vec3 e2 = unit(minus(y_towards, scaled(e1, dot(y_towards, e1))));
    const Vec3 e3 = cross(e1, e2);
    GroupFrame f;
    for (int i = 0; i < 3; ++i) f.rotation[i] = {e1[i], e2[i], e3[i]};  // the axes as columns
    f.translation = origin;
    return f;
  };
  GroupFrame identity;
  for (int i = 0; i < 3; ++i) identity.rotation[i][i] = 1.0;
  std::array<GroupFrame, kRigidGroups> frames;
  frames.fill(identity);
  if (type.atoms.empty()) return frames;
  const Vec3 &n = position("N"), &ca = position("CA"), &c = position("C");
  frames[2] = frame(minus(n, ca), {1.0, 0.0, 0.0}, n);  // phi turns about CA-N
  frames[3] = frame(minus(c, ca), minus(ca, n), c);     // psi about CA-C
  for (size_t k = 0; k < type.chis.size(); ++k) {
    if (k == 0) {
      const Vec3& cb = position(type.chis[0][2]);
      frames[4] = frame(minus(cb, ca), minus(n, ca), cb);
    } else {
      // The axis end in the previous chi group's frame, whose origin is the axis start.
      const Vec3& axis_end = position(type.chis[k][2]);
      frames[4 + k] = frame(axis_end, {-1.0, 0.0, 0.0}, axis_end);
    }
  }
  return frames;
}

}  // namespace kuafu::fold
