#include "apps/fastfold/violations.h"

#include <algorithm>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "apps/fastfold/residue_geometry.h"
#include "apps/fastfold/residue_types.h"
#include "core/util/error.h"

namespace kuafu::fold {
namespace {

struct MeasuredPair {
  const char* residue;
  const char* atom1;
  const char* atom2;
  double distance, spread;  // Å
};

const MeasuredPair kResiduePairs[] = {
#define KUAFU_RESIDUE_PAIRS
#include "apps/fastfold/data/residue_bonds.inc"
#undef KUAFU_RESIDUE_PAIRS
};

struct MeasuredPeptide {
  const char* name;
  double median, spread;
  int count;
};

const MeasuredPeptide kPeptide[] = {
#define KUAFU_PEPTIDE_GEOMETRY
#include "apps/fastfold/data/residue_bonds.inc"
#undef KUAFU_PEPTIDE_GEOMETRY
};

const MeasuredPeptide& peptide(const std::string& name) {
  for (const MeasuredPeptide& p : kPeptide)
    if (name == p.name) return p;
  fail("residue_bonds.inc has no peptide measure " + name);
}

double van_der_waals_radius(const std::string& atom) {
  switch (atom.at(0)) {
    case 'C': return 1.7;
    case 'N': return 1.55;
    case 'O': return 1.52;
    case 'S': return 1.8;
    default: fail("no van der Waals radius for atom " + atom);
  }
}

int64_t slot_of(const ResidueType& type, const std::string& atom) {
  const auto at = std::find(type.atoms.begin(), type.atoms.end(), atom);
  KUAFU_CHECK(at != type.atoms.end(), "residue_bonds.inc names atom " + atom + " that " + type.name + " lacks");
  return at - type.atoms.begin();
}

// [N] -> [N + 1] with a zero after (`after`) or before the values.
torch::Tensor pad_one(const torch::Tensor& t, bool after) { return torch::constant_pad_nd(t, {after ? 0 : 1, after ? 1 : 0}, 0); }

torch::Tensor vector_length(const torch::Tensor& v) { return torch::sqrt(1e-6 + v.square().sum(-1)); }  // [*, 3] -> [*]

// A flat-bottom loss: how far |value − ideal| (ε under the root, as AlphaFold) is past `allowed`, and whether it is.
std::pair<torch::Tensor, torch::Tensor> flat_bottom(const torch::Tensor& value, const torch::Tensor& ideal,
                                                    const torch::Tensor& allowed) {
  const torch::Tensor error = torch::sqrt(1e-6 + (value - ideal).square());
  return {torch::relu(error - allowed), (error > allowed).to(value.scalar_type())};
}

// The masked mean AlphaFold's peptide terms take.
torch::Tensor bond_mean(const torch::Tensor& loss, const torch::Tensor& mask) {
  return (loss * mask).sum() / (mask.sum() + 1e-6);
}

struct PeptideViolations {
  torch::Tensor c_n_loss, ca_c_n_loss, c_n_ca_loss, per_residue, ca_ca_extreme;
};

// Equations 44-45 over the R − 1 peptide bonds; a residue's mark is either of its bonds'.
PeptideViolations peptide_violations(const torch::Tensor& atom14, const torch::Tensor& exists, const torch::Tensor& aatype,
                                     const torch::Tensor& residue_index, const ViolationSettings& settings) {
  const PeptideGeometry& g = settings.peptide;
  const double k = settings.tolerance_factor;
  const int64_t bonds = std::max<int64_t>(atom14.size(0) - 1, 0);
  const auto this_residue = [&](const torch::Tensor& t, int64_t slot) { return t.narrow(0, 0, bonds).select(1, slot); };
  const auto next_residue = [&](const torch::Tensor& t, int64_t slot) { return t.narrow(0, 1, bonds).select(1, slot); };
  constexpr int64_t n = 0, ca = 1, c = 2;
  const torch::Tensor this_ca = this_residue(atom14, ca), this_c = this_residue(atom14, c);   // [B, 3]
  const torch::Tensor next_n = next_residue(atom14, n), next_ca = next_residue(atom14, ca);   // [B, 3]
  const torch::Tensor follows = (residue_index.narrow(0, 1, bonds) - residue_index.narrow(0, 0, bonds) == 1)
                                    .to(atom14.scalar_type());  // [B]: no gap in the numbering
  const torch::Tensor c_n_mask = this_residue(exists, c) * next_residue(exists, n) * follows;

  // C(i)-N(i+1), longer before a proline.
  const torch::Tensor c_n_length = vector_length(this_c - next_n);
  const torch::Tensor proline = (aatype.narrow(0, 1, bonds) == residue_type_index('P')).to(atom14.scalar_type());
  const torch::Tensor ideal_length = g.c_n + proline * (g.c_n_proline - g.c_n);
  const torch::Tensor length_spread = g.c_n_spread + proline * (g.c_n_proline_spread - g.c_n_spread);
  auto [c_n, c_n_out] = flat_bottom(c_n_length, ideal_length, k * length_spread);

  // The angles at C(i) and at N(i+1), as cosines of unit vectors.
  const torch::Tensor c_to_ca = (this_ca - this_c) / vector_length(this_ca - this_c).unsqueeze(-1);
  const torch::Tensor c_to_n = (next_n - this_c) / c_n_length.unsqueeze(-1);
  const torch::Tensor n_to_ca = (next_ca - next_n) / vector_length(next_ca - next_n).unsqueeze(-1);
  const auto cosine_error = [&](const torch::Tensor& cosine, double ideal, double spread) {
    return flat_bottom(cosine, torch::full_like(cosine, ideal), torch::full_like(cosine, k * spread));
  };
  auto [ca_c_n, ca_c_n_out] = cosine_error((c_to_ca * c_to_n).sum(-1), g.cos_ca_c_n, g.cos_ca_c_n_spread);
  auto [c_n_ca, c_n_ca_out] = cosine_error((-c_to_n * n_to_ca).sum(-1), g.cos_c_n_ca, g.cos_c_n_ca_spread);
  const torch::Tensor ca_c_n_mask = c_n_mask * this_residue(exists, ca);
  const torch::Tensor c_n_ca_mask = c_n_mask * next_residue(exists, ca);

  PeptideViolations v;
  v.c_n_loss = bond_mean(c_n, c_n_mask);
  v.ca_c_n_loss = bond_mean(ca_c_n, ca_c_n_mask);
  v.c_n_ca_loss = bond_mean(c_n_ca, c_n_ca_mask);
  const torch::Tensor bond_out = torch::stack({c_n_out * c_n_mask, ca_c_n_out * ca_c_n_mask, c_n_ca_out * c_n_ca_mask}).amax(0);
  v.per_residue = torch::maximum(pad_one(bond_out, true), pad_one(bond_out, false));  // [R]
  const torch::Tensor ca_ca_mask = this_residue(exists, ca) * next_residue(exists, ca) * follows;
  const torch::Tensor extreme = (vector_length(this_ca - next_ca) - g.ca_ca > settings.ca_ca_tolerance).to(atom14.scalar_type());
  v.ca_ca_extreme = (ca_ca_mask * extreme).sum() / (ca_ca_mask.sum() + 1e-10);
  return v;
}

// Equation 46 between residues: every pair of atoms in residues i < j (by number) nearer than their radii less the
// overlap, but for the peptide bond C(i)-N(i+1) and a disulfide bridge's two SG. In blocks of rows so that a
// long prediction never holds all (14 R)² distances (settings.clash_block_pairs a block).
std::pair<torch::Tensor, torch::Tensor> clashes(const torch::Tensor& atom14, const torch::Tensor& exists,
                                                const torch::Tensor& aatype, const torch::Tensor& residue_index,
                                                const ViolationSettings& settings) {
  const int64_t r = atom14.size(0);
  const auto opts = atom14.options();
  torch::Tensor c_to_n = torch::zeros({1, kAtom14, 1, kAtom14}, opts);
  c_to_n.index_put_({0, 2, 0, 0}, 1.0);  // C of the first residue, N of the next
  // Only two cysteines' SG make a bridge (AlphaFold leaves out any two atoms in SG's slot, whatever their residues).
  const int64_t cys = residue_type_index('C');
  const int64_t sg = slot_of(residue_types()[cys], "SG");
  torch::Tensor sg_pair = torch::zeros({1, kAtom14, 1, kAtom14}, opts);
  sg_pair.index_put_({0, sg, 0, sg}, 1.0);
  const torch::Tensor is_cys = (aatype == cys).to(opts.dtype());
  const torch::Tensor radius = exists * per_residue(atom14_radii().to(opts), aatype);  // [R, 14]
  const torch::Tensor all_atoms = atom14.reshape({r * kAtom14, 3});

  const int64_t block = std::max<int64_t>(1, settings.clash_block_pairs / std::max<int64_t>(1, r * kAtom14 * kAtom14));
  std::vector<torch::Tensor> row_loss, row_clash;               // [n, 14] each
  torch::Tensor column_loss = torch::zeros({r, kAtom14}, opts);  // [R, 14]
  torch::Tensor column_clash = torch::zeros({r, kAtom14}, opts);
  for (int64_t start = 0; start < r; start += block) {
    const int64_t n = std::min(block, r - start);
    const auto rows = [&](const torch::Tensor& t) { return t.narrow(0, start, n); };
    // cdist leaves out the differences a broadcast would make: [n, 14, R, 14].
    const torch::Tensor distance =
        torch::cdist(rows(atom14).reshape({n * kAtom14, 3}), all_atoms, 2.0, /*compute_mode=*/2).view({n, kAtom14, r, kAtom14});
    const torch::Tensor ri = rows(residue_index).view({n, 1, 1, 1}), rj = residue_index.view({1, 1, r, 1});
    torch::Tensor mask = rows(exists).view({n, kAtom14, 1, 1}) * exists.view({1, 1, r, kAtom14}) * (ri < rj).to(opts.dtype());
    mask = mask * (1 - (ri + 1 == rj).to(opts.dtype()) * c_to_n);
    mask = mask * (1 - rows(is_cys).view({n, 1, 1, 1}) * is_cys.view({1, 1, r, 1}) * sg_pair);
    const torch::Tensor nearest = mask * (rows(radius).view({n, kAtom14, 1, 1}) + radius.view({1, 1, r, kAtom14}));
    const torch::Tensor overlap = mask * torch::relu(nearest - settings.clash_overlap - distance);
    const torch::Tensor clash = mask * (distance < nearest - settings.clash_overlap).to(opts.dtype());
    row_loss.push_back(overlap.sum(at::IntArrayRef{2, 3}));
    row_clash.push_back(clash.amax(at::IntArrayRef{2, 3}));
    column_loss = column_loss + overlap.sum(at::IntArrayRef{0, 1});
    column_clash = torch::maximum(column_clash, clash.amax(at::IntArrayRef{0, 1}));
  }
  if (r == 0) return {column_loss, column_clash};
  return {torch::cat(row_loss) + column_loss, torch::maximum(torch::cat(row_clash), column_clash)};
}

// Equation 46 within each residue: every pair of its atoms outside the bounds of its type.
std::pair<torch::Tensor, torch::Tensor> within_residue(const torch::Tensor& atom14, const torch::Tensor& exists,
                                                       const torch::Tensor& aatype, const AtomDistanceBounds& bounds) {
  const torch::Tensor lower = per_residue(bounds.lower, aatype), upper = per_residue(bounds.upper, aatype);  // [R, 14, 14]
  const torch::Tensor mask = exists.unsqueeze(2) * exists.unsqueeze(1) * (1 - torch::eye(kAtom14, atom14.options()));
  const torch::Tensor distance = torch::sqrt(1e-10 + (atom14.unsqueeze(2) - atom14.unsqueeze(1)).square().sum(-1));
  const torch::Tensor out = mask * (torch::relu(lower - distance) + torch::relu(distance - upper));
  const torch::Tensor violation = mask * ((distance < lower) | (distance > upper)).to(atom14.scalar_type());
  return {out.sum(1) + out.sum(2), torch::maximum(violation.amax(1), violation.amax(2))};
}

}  // namespace

const PeptideGeometry& measured_peptide_geometry() {
  static const PeptideGeometry g = [] {
    PeptideGeometry p;
    p.c_n = peptide("c_n").median;
    p.c_n_spread = peptide("c_n").spread;
    p.c_n_proline = peptide("c_n_pro").median;
    p.c_n_proline_spread = peptide("c_n_pro").spread;
    p.cos_ca_c_n = peptide("cos_ca_c_n").median;
    p.cos_ca_c_n_spread = peptide("cos_ca_c_n").spread;
    p.cos_c_n_ca = peptide("cos_c_n_ca").median;
    p.cos_c_n_ca_spread = peptide("cos_c_n_ca").spread;
    p.ca_ca = peptide("ca_ca").median;
    return p;
  }();
  return g;
}

torch::Tensor atom14_radii() {
  torch::Tensor radii = torch::zeros({kResidueTypes + 1, kAtom14});
  auto r = radii.accessor<float, 2>();
  for (int64_t t = 0; t < kResidueTypes; ++t) {
    const ResidueType& type = residue_types()[t];
    for (size_t a = 0; a < type.atoms.size(); ++a) r[t][a] = static_cast<float>(van_der_waals_radius(type.atoms[a]));
  }
  return radii;
}

AtomDistanceBounds atom14_distance_bounds(const ViolationSettings& settings) {
  const torch::Tensor radii = atom14_radii();
  torch::Tensor lower = torch::zeros({kResidueTypes + 1, kAtom14, kAtom14});
  torch::Tensor upper = torch::zeros_like(lower);
  auto lo = lower.accessor<float, 3>(), up = upper.accessor<float, 3>();
  auto r = radii.accessor<float, 2>();
  for (int64_t t = 0; t < kResidueTypes; ++t) {
    const int64_t atoms = static_cast<int64_t>(residue_types()[t].atoms.size());
    for (int64_t i = 0; i < atoms; ++i) {
      for (int64_t j = 0; j < atoms; ++j) {
        if (i == j) continue;
        lo[t][i][j] = static_cast<float>(r[t][i] + r[t][j] - settings.clash_overlap);
        up[t][i][j] = 1e10f;
      }
    }
  }
  for (const MeasuredPair& pair : kResiduePairs) {
    const int64_t t = [&] {  // residue_types() is in aatype order
      for (int64_t k = 0; k < kResidueTypes; ++k)
        if (residue_types()[k].name == pair.residue) return k;
      fail(std::string("residue_bonds.inc names residue ") + pair.residue);
    }();
    const ResidueType& type = residue_types()[t];
    const int64_t i = slot_of(type, pair.atom1), j = slot_of(type, pair.atom2);
    const double allowed = settings.tolerance_factor * pair.spread;
    lo[t][i][j] = lo[t][j][i] = static_cast<float>(pair.distance - allowed);
    up[t][i][j] = up[t][j][i] = static_cast<float>(pair.distance + allowed);
  }
  return {lower, upper};
}

StructuralViolations structural_violations(const torch::Tensor& atom14, const torch::Tensor& exists,
                                           const torch::Tensor& aatype, const torch::Tensor& residue_index,
                                           const AtomDistanceBounds& bounds, const ViolationSettings& settings) {
  const AtomDistanceBounds local{bounds.lower.to(atom14.options()), bounds.upper.to(atom14.options())};
  const torch::Tensor mask = exists.to(atom14.scalar_type());
  StructuralViolations v;
  PeptideViolations peptide = peptide_violations(atom14, mask, aatype, residue_index, settings);
  v.c_n_loss = peptide.c_n_loss;
  v.ca_c_n_loss = peptide.ca_c_n_loss;
  v.c_n_ca_loss = peptide.c_n_ca_loss;
  v.connection_violation = peptide.per_residue;
  v.ca_ca_extreme = peptide.ca_ca_extreme;
  std::tie(v.clash_loss_per_atom, v.clash_per_atom) = clashes(atom14, mask, aatype, residue_index, settings);
  std::tie(v.within_loss_per_atom, v.within_violation_per_atom) = within_residue(atom14, mask, aatype, local);
  v.residue_violation = torch::stack({v.connection_violation, v.clash_per_atom.amax(-1), v.within_violation_per_atom.amax(-1)})
                            .amax(0);
  return v;
}

torch::Tensor violation_loss(const StructuralViolations& v, const torch::Tensor& exists) {
  return v.c_n_loss + v.ca_c_n_loss + v.c_n_ca_loss +
         (v.clash_loss_per_atom + v.within_loss_per_atom).sum() / (1e-6 + exists.sum());
}

ViolationFractions violation_fractions(const StructuralViolations& v, const torch::Tensor& residue_mask) {
  const auto fraction = [&](const torch::Tensor& marks) {
    return ((residue_mask * marks).sum() / (1e-10 + residue_mask.sum())).item<double>();
  };
  ViolationFractions f;
  f.bond = fraction(v.connection_violation);
  f.clash = fraction(v.clash_per_atom.amax(-1));
  f.within = fraction(v.within_violation_per_atom.amax(-1));
  f.any = fraction(v.residue_violation);
  f.extreme_ca_ca = v.ca_ca_extreme.item<double>();
  return f;
}

}  // namespace kuafu::fold
