#include "apps/fastfold/residue_geometry.h"

#include <torch/torch.h>

namespace kuafu::fold {
namespace {

constexpr int kTypesWithUnknown = kResidueTypes + 1;

// Gathers per-atom values [R, A, *] into another layout by index [R, B] -> [R, B, *].
torch::Tensor gather_atoms(const torch::Tensor& values, const torch::Tensor& index) {
  torch::Tensor expanded = index;
  for (int64_t d = 2; d < values.dim(); ++d) expanded = expanded.unsqueeze(-1);
  std::vector<int64_t> shape(values.sizes().begin(), values.sizes().end());
  shape[1] = index.size(1);
  return values.gather(1, expanded.expand(shape));
}

torch::Tensor masked(const torch::Tensor& values, const torch::Tensor& mask) {
  torch::Tensor m = mask;
  while (m.dim() < values.dim()) m = m.unsqueeze(-1);
  return values * m;
}

}  // namespace

torch::Tensor per_residue(const torch::Tensor& table, const torch::Tensor& aatype) { return table.index_select(0, aatype); }

ResidueGeometry ResidueGeometry::to(const torch::TensorOptions& options) const {
  const auto floats = [&](const torch::Tensor& t) { return t.to(options.device(), options.dtype()); };
  const auto ints = [&](const torch::Tensor& t) { return t.to(options.device()); };
  return {{floats(default_frames.rotation), floats(default_frames.translation)},
          ints(atom14_group),      floats(atom14_exists),   floats(atom14_positions), ints(atom14_to_atom37),
          ints(atom37_to_atom14),  floats(atom37_exists),   floats(chi_exists),       floats(chi_pi_periodic),
          floats(atom14_ambiguous), floats(renaming), ints(chi_atoms), ints(group_base_atoms), floats(group_exists),
          floats(group_ambiguous)};
}

ResidueGeometry residue_geometry(const std::array<std::vector<GroupedAtom>, kResidueTypes>& grouped) {
  const auto f64 = torch::TensorOptions(torch::kFloat64);
  const auto i64 = torch::TensorOptions(torch::kInt64);
  torch::Tensor rotation = torch::eye(3, f64).repeat({kTypesWithUnknown, kRigidGroups, 1, 1});
  torch::Tensor translation = torch::zeros({kTypesWithUnknown, kRigidGroups, 3}, f64);
  torch::Tensor group = torch::zeros({kTypesWithUnknown, kAtom14}, i64);
  torch::Tensor exists14 = torch::zeros({kTypesWithUnknown, kAtom14}, f64);
  torch::Tensor positions = torch::zeros({kTypesWithUnknown, kAtom14, 3}, f64);
  torch::Tensor to37 = torch::zeros({kTypesWithUnknown, kAtom14}, i64);
  torch::Tensor to14 = torch::zeros({kTypesWithUnknown, kAtom37}, i64);
  torch::Tensor exists37 = torch::zeros({kTypesWithUnknown, kAtom37}, f64);
  torch::Tensor chis = torch::zeros({kTypesWithUnknown, 4}, f64);
  torch::Tensor pi_periodic = torch::zeros({kTypesWithUnknown, 4}, f64);
  torch::Tensor ambiguous = torch::zeros({kTypesWithUnknown, kAtom14}, f64);
  torch::Tensor renaming = torch::eye(kAtom14, f64).repeat({kTypesWithUnknown, 1, 1});
  torch::Tensor chi_atoms = torch::zeros({kTypesWithUnknown, 4, 4}, i64);
  torch::Tensor base_atoms = torch::zeros({kTypesWithUnknown, kRigidGroups, 3}, i64);
  torch::Tensor group_exists = torch::zeros({kTypesWithUnknown, kRigidGroups}, f64);
  torch::Tensor group_ambiguous = torch::zeros({kTypesWithUnknown, kRigidGroups}, f64);
  // Every type, the unknown one too, has a backbone frame (C behind CA along x, N in the plane) and a psi
  // frame (CA behind C, O in the plane).
  const auto set_base = [&](int64_t t, int64_t g, const std::array<std::string, 3>& names) {
    for (int64_t i = 0; i < 3; ++i) base_atoms[t][g][i] = atom37_index(names[i]);
    group_exists[t][g] = 1.0;
  };
  for (int64_t t = 0; t < kTypesWithUnknown; ++t) {
    set_base(t, 0, {"C", "CA", "N"});
    set_base(t, 3, {"CA", "C", "O"});
  }
  for (int t = 0; t < kResidueTypes; ++t) {
    const ResidueType& type = residue_types()[t];
    const std::vector<GroupedAtom>& atoms = grouped[t];
    const auto slot = [&](const std::string& name) {
      for (size_t i = 0; i < atoms.size(); ++i)
        if (atoms[i].name == name) return static_cast<int64_t>(i);
      return int64_t{-1};
    };
    for (size_t i = 0; i < atoms.size(); ++i) {
      const int64_t a37 = atom37_index(atoms[i].name);
      group[t][i] = atoms[i].group;
      exists14[t][i] = 1.0;
      for (int x = 0; x < 3; ++x) positions[t][i][x] = atoms[i].position[x];
      to37[t][i] = a37;
      to14[t][a37] = static_cast<int64_t>(i);
      exists37[t][a37] = 1.0;
    }
    const std::array<GroupFrame, kRigidGroups> frames = default_group_frames(type, atoms);
    for (int g = 0; g < kRigidGroups; ++g)
      for (int i = 0; i < 3; ++i) {
        translation[t][g][i] = frames[g].translation[i];
        for (int j = 0; j < 3; ++j) rotation[t][g][i][j] = frames[g].rotation[i][j];
      }
    for (size_t k = 0; k < type.chis.size(); ++k) {
      const auto& chi = type.chis[k];
      chis[t][k] = 1.0;
      for (int64_t i = 0; i < 4; ++i) chi_atoms[t][k][i] = atom37_index(chi[i]);
      set_base(t, 4 + static_cast<int64_t>(k), {chi[1], chi[2], chi[3]});
    }
    if (!type.swaps.empty()) group_ambiguous[t][3 + static_cast<int64_t>(type.chis.size())] = 1.0;
    if (type.pi_periodic_chi >= 0) pi_periodic[t][type.pi_periodic_chi] = 1.0;
    for (const auto& [a, b] : type.swaps) {
      const int64_t i = slot(a), j = slot(b);
      ambiguous[t][i] = ambiguous[t][j] = 1.0;
      renaming[t][i][i] = renaming[t][j][j] = 0.0;
      renaming[t][i][j] = renaming[t][j][i] = 1.0;
    }
  }
  return ResidueGeometry{{rotation, translation}, group, exists14, positions, to37, to14, exists37, chis, pi_periodic,
                         ambiguous, renaming, chi_atoms, base_atoms, group_exists, group_ambiguous}
      .to(torch::TensorOptions(torch::kFloat32));
}

const ResidueGeometry& ideal_residue_geometry() {
  static const ResidueGeometry geometry = [] {
    std::array<std::vector<GroupedAtom>, kResidueTypes> grouped;
    for (int t = 0; t < kResidueTypes; ++t) grouped[t] = ideal_grouped_atoms(residue_types()[t]);
    return residue_geometry(grouped);
  }();
  return geometry;
}

Rigid torsions_to_frames(const ResidueGeometry& geometry, const torch::Tensor& aatype, const Rigid& backbone,
                         const torch::Tensor& sin_cos) {
  const int64_t residues = aatype.size(0);
  // The backbone group turns by nothing: (sin, cos) = (0, 1) before the seven torsions.
  const torch::Tensor sin = torch::cat({torch::zeros({residues, 1}, sin_cos.options()), sin_cos.select(-1, 0)}, -1);  // [R, 8]
  const torch::Tensor cos = torch::cat({torch::ones({residues, 1}, sin_cos.options()), sin_cos.select(-1, 1)}, -1);
  const torch::Tensor zero = torch::zeros_like(sin), one = torch::ones_like(sin);
  const torch::Tensor turn = torch::stack({torch::stack({one, zero, zero}, -1), torch::stack({zero, cos, -sin}, -1),
                                           torch::stack({zero, sin, cos}, -1)}, -2);  // [R, 8, 3, 3] about x
  const Rigid defaults{per_residue(geometry.default_frames.rotation, aatype), per_residue(geometry.default_frames.translation, aatype)};
  const Rigid local{torch::matmul(defaults.rotation, turn), defaults.translation};  // each group in its parent's frame
  // chi2..chi4 hang off the previous chi group; the others off the backbone.
  std::vector<torch::Tensor> rotations, translations;
  Rigid previous;
  for (int64_t g = 0; g < kRigidGroups; ++g) {
    Rigid group{local.rotation.select(1, g), local.translation.select(1, g)};
    if (g > 4) group = previous.compose(group);
    previous = group;
    rotations.push_back(group.rotation);
    translations.push_back(group.translation);
  }
  const Rigid to_backbone{torch::stack(rotations, 1), torch::stack(translations, 1)};  // [R, 8]
  return backbone.unsqueeze(1).compose(to_backbone);
}

torch::Tensor frames_to_atom14(const ResidueGeometry& geometry, const torch::Tensor& aatype, const Rigid& frames) {
  const torch::Tensor group = per_residue(geometry.atom14_group, aatype);  // [R, 14]
  const Rigid atom_frames{gather_atoms(frames.rotation, group), gather_atoms(frames.translation, group)};  // [R, 14]
  const torch::Tensor placed = atom_frames.apply(per_residue(geometry.atom14_positions, aatype));               // [R, 14, 3]
  return masked(placed, per_residue(geometry.atom14_exists, aatype));
}

torch::Tensor atom14_to_atom37(const ResidueGeometry& geometry, const torch::Tensor& aatype, const torch::Tensor& atom14) {
  return masked(gather_atoms(atom14, per_residue(geometry.atom37_to_atom14, aatype)), per_residue(geometry.atom37_exists, aatype));
}

torch::Tensor atom37_to_atom14(const ResidueGeometry& geometry, const torch::Tensor& aatype, const torch::Tensor& atom37) {
  return masked(gather_atoms(atom37, per_residue(geometry.atom14_to_atom37, aatype)), per_residue(geometry.atom14_exists, aatype));
}

}  // namespace kuafu::fold
