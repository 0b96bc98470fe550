// AlphaFold 2's structural violations (supplement 1.9.11, equations 44-47): the peptide bond's length and angles
// between consecutive residues, clashes between atoms of different residues, and atoms of one residue nearer or
// further apart than their bonds, angles and radii allow. Their loss is what AlphaFold's fine-tuning stage adds;
// their marks say which residues of a prediction are not physical. Maths only.
#pragma once

#include <torch/types.h>

namespace kuafu::fold {

// The peptide bond between residues i and i+1 as Debian's PDB files show it (data/residue_bonds.inc, written by
// residue_bonds.py): the median and spread of C(i)-N(i+1), Å (apart when residue i+1 is a proline), of the cosines
// of the angles CA(i)-C(i)-N(i+1) and C(i)-N(i+1)-CA(i+1), and of CA(i)-CA(i+1).
struct PeptideGeometry {
  double c_n = 0, c_n_spread = 0, c_n_proline = 0, c_n_proline_spread = 0;
  double cos_ca_c_n = 0, cos_ca_c_n_spread = 0, cos_c_n_ca = 0, cos_c_n_ca_spread = 0;
  double ca_ca = 0;
};
const PeptideGeometry& measured_peptide_geometry();

struct ViolationSettings {
  double tolerance_factor = 12.0;  // spreads a bond or an angle may deviate before it counts (AlphaFold's 12)
  double clash_overlap = 1.5;      // Å two atoms' van der Waals spheres may overlap before they clash
  double ca_ca_tolerance = 1.5;    // Å past the usual CA-CA distance that counts as an extreme one (a metric)
  int64_t clash_block_pairs = int64_t{1} << 24;  // atom pairs one block of the clash check holds (memory, not maths)
  PeptideGeometry peptide = measured_peptide_geometry();
};

// The nearest and furthest each pair of a residue type's atoms may be, Å, [21, 14, 14] each (atom14 slots; 0 where
// a slot is empty or on the diagonal; row 20, the unknown residue, all 0).
struct AtomDistanceBounds {
  torch::Tensor lower, upper;
};

// Kuafu's bounds from the measured distances (data/residue_bonds.inc): a bonded pair, or a pair two bonds apart,
// within tolerance_factor spreads of its median; any other pair no nearer than its van der Waals radii less
// clash_overlap, and no upper limit (1e10). Float32, CPU.
AtomDistanceBounds atom14_distance_bounds(const ViolationSettings& settings);

// Each atom14 slot's van der Waals radius by its element (Bondi 1964: C 1.7, N 1.55, O 1.52, S 1.8 Å),
// [21, 14], 0 in empty slots. Float32, CPU.
torch::Tensor atom14_radii();

struct StructuralViolations {
  // Between consecutive residues (equations 44, 45): each the mean of a flat-bottom loss over the peptide bonds
  // whose atoms exist and whose residue numbers follow each other.
  torch::Tensor c_n_loss, ca_c_n_loss, c_n_ca_loss;  // []
  torch::Tensor connection_violation;                // [R] 1 where either of the residue's peptide bonds is out
  torch::Tensor ca_ca_extreme;                       // [] fraction of those bonds with CA-CA past ca_ca_tolerance
  // Atoms of different residues nearer than their radii less the overlap (equation 46).
  torch::Tensor clash_loss_per_atom;  // [R, 14] the sum of the atom's overlaps beyond the tolerance, Å
  torch::Tensor clash_per_atom;       // [R, 14] 1 where the atom clashes
  // Atoms of one residue outside their bounds (equation 46 within a residue, bonds and angles).
  torch::Tensor within_loss_per_atom;       // [R, 14] the sum of the atom's distances out of bounds, Å
  torch::Tensor within_violation_per_atom;  // [R, 14] 1 where one is
  torch::Tensor residue_violation;          // [R] 1 where any of the above marks the residue
};

// atom14 [R, 14, 3] the predicted atoms, Å; exists [R, 14] 0/1 the atoms the residues' types have; aatype and
// residue_index [R] int64; bounds as atom14_distance_bounds gives them (or AlphaFold's), in atom14's dtype.
StructuralViolations structural_violations(const torch::Tensor& atom14, const torch::Tensor& exists,
                                           const torch::Tensor& aatype, const torch::Tensor& residue_index,
                                           const AtomDistanceBounds& bounds, const ViolationSettings& settings);

// Equation 47: the three peptide-bond terms plus the clash and within-residue losses of every atom over the
// number of atoms. exists [R, 14] -> [].
torch::Tensor violation_loss(const StructuralViolations& violations, const torch::Tensor& exists);

// The fractions of residues under residue_mask [R] that have a broken peptide bond, a clash, a violation
// within, or any; and of peptide bonds with an extreme CA-CA distance (AlphaFold's violation metrics).
struct ViolationFractions {
  double bond = 0, clash = 0, within = 0, any = 0, extreme_ca_ca = 0;
};
ViolationFractions violation_fractions(const StructuralViolations& violations, const torch::Tensor& residue_mask);

}  // namespace kuafu::fold
