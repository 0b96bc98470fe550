// The golden files of DeepMind's AlphaFold 2.3 on a tiny model (tests/apps/fastfold/alphafold_reference.py
// wrote them; tests/apps/fastfold/golden/alphafold_tiny/manifest.json records its hash, arguments and
// versions), read once per test binary, and the comparison every FastFold golden test makes.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "apps/fastfold/alphafold_model.h"
#include "apps/fastfold/evoformer.h"
#include "apps/fastfold/fold_data.h"
#include "apps/fastfold/residue_geometry.h"
#include "apps/fastfold/structure_losses.h"
#include "apps/fastfold/violations.h"
#include "core/io/npz.h"

namespace kuafu::fold::testing {

// `folder`: alphafold_tiny (initial training's losses), or alphafold_tiny_finetune (the fine-tuning stage: the
// violation and experimentally-resolved losses on, the whole model only).
inline const io::NpzArrays& alphafold_golden(const std::string& file, const std::string& folder = "alphafold_tiny") {
  static std::map<std::string, io::NpzArrays> files;
  const std::filesystem::path path = std::filesystem::path(KUAFU_SOURCE_DIR) / "tests/apps/fastfold/golden" / folder / file;
  auto found = files.find(path.string());
  if (found == files.end()) found = files.emplace(path.string(), io::read_npz(path.string())).first;
  return found->second;
}

// float32 on both sides, summed in other orders: outputs and gradients agree to 1e-5 of their largest
// entry (measured: 1e-7 to 1.3e-6). A gradient that vanishes in exact arithmetic (a bias shifting every
// logit of a row alike, which softmax ignores: the pair-bias LayerNorm's offset, IPA's attention_2d bias)
// is float32 cancellation noise on both sides, up to ~3e-6 here for terms of size ~10: it must stay
// under 1e-5. The measured figures are printed.
// `tolerance` replaces 1e-5 where a test states why.
inline void expect_like_alphafold(const torch::Tensor& actual, const torch::Tensor& expected, const std::string& what,
                                  double tolerance = 1e-5) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double scale = expected.abs().max().item<double>();
  const double difference = (actual.to(torch::kCPU, torch::kFloat64) - expected.to(torch::kFloat64)).abs().max().item<double>();
  std::cout << "  " << what << ": max |difference| " << difference << " of max |value| " << scale << "\n";
  const bool vanishes = scale < 1e-4;
  EXPECT_LE(vanishes ? actual.abs().max().item<double>() : difference, tolerance * (vanishes ? 1.0 : scale)) << what;
}

// AlphaFold's residue_constants (Engh & Huber 1991): its peptide bond, and the spread it gives the angle at C,
// which is the C-N bond's 0.014 (all_atom.between_residue_bond_loss reads the bond's spread there; the angle's
// own is 0.0311, what Kuafu's measured table would use).
inline ViolationSettings alphafold_violation_settings() {
  ViolationSettings s;
  s.peptide = {1.329, 0.014, 1.341, 0.016, -0.4473, 0.014, -0.5203, 0.0353, 3.80209737096};
  return s;
}

// AlphaFold's bounds on the distances within each residue type (golden alphafold_violations.npz), [21, 14, 14].
inline AtomDistanceBounds alphafold_distance_bounds() {
  const io::NpzArrays& g = alphafold_golden("alphafold_violations.npz", ".");
  return {g.at("bounds/lower"), g.at("bounds/upper")};
}

// Every parameter's gradient of `module` (its .npz path `module_path`) against the golden's
// "<test>/dparam/<key>" arrays; a missing array fails.
inline void expect_parameter_gradients_like_alphafold(torch::nn::Module& module, const io::NpzArrays& golden,
                                                      const std::string& test, const std::string& module_path,
                                                      double tolerance = 1e-5) {
  for (const auto& item : module.named_parameters()) {
    const std::string key = test + "/dparam/" + alphafold_key(module_path, item.key());
    ASSERT_TRUE(golden.count(key)) << key;
    expect_like_alphafold(item.value().grad(), golden.at(key), "d/d " + item.key(), tolerance);
  }
}

}  // namespace kuafu::fold::testing

namespace kuafu::fold::testing {

// `count` chains of Debian's ProMod3 structure database (every 997th), backbone only, no MSA beyond themselves.
inline std::vector<FoldChain> database_chains(size_t count) {
  static const StructureDb db = read_structure_db(kDebianStructureDb);
  std::vector<FoldChain> chains;
  for (size_t i = 0; chains.size() < count; i += 997) chains.push_back(chain_from_database(db.chain(i), std::to_string(i)));
  return chains;
}

// The tiny model of the golden config.json: c_m 16, c_z 8, c_s 16, c_e 8, 2 Evoformer blocks, 1 extra-MSA
// block, 2 heads, IPA 2 heads of 4 scalar and 2/3 points, 2 structure layers.
inline AlphaFoldSizes golden_tiny_sizes() {
  AlphaFoldSizes s;
  s.msa_channels = 16;
  s.pair_channels = 8;
  s.single_channels = 16;
  s.extra_msa_channels = 8;
  s.evoformer_blocks = 2;
  s.extra_msa_blocks = 1;
  s.msa_heads = s.pair_heads = 2;
  s.outer_channels = 4;
  s.triangle_channels = 8;
  s.structure.ipa = {16, 8, 2, 4, 4, 2, 3};
  s.structure.layers = 2;
  s.structure.angle_channels = 8;
  s.plddt_channels = 8;
  return s;
}

// AlphaFold's proportions at a small width (heads of 8 channels; IPA's 12 heads scaled to 4): c_m 32,
// c_z 16, 2 Evoformer blocks, 1 extra-MSA block, 4 structure layers.
inline AlphaFoldSizes small_alphafold_sizes() {
  AlphaFoldSizes s;
  s.msa_channels = 32;
  s.pair_channels = 16;
  s.single_channels = 32;
  s.extra_msa_channels = 8;
  s.evoformer_blocks = 2;
  s.extra_msa_blocks = 1;
  s.msa_heads = 4;
  s.pair_heads = 2;
  s.outer_channels = 8;
  s.triangle_channels = 16;
  s.structure.ipa = {32, 16, 4, 8, 8, 4, 8};
  s.structure.layers = 4;
  s.structure.angle_channels = 32;
  s.plddt_channels = 32;
  return s;
}

// A rigid [*] as AlphaFold's flat12 [*, 12]: the rotation row by row, then the translation; and back.
inline torch::Tensor flat12(const Rigid& rigid) { return torch::cat({rigid.rotation.flatten(-2), rigid.translation}, -1); }
inline Rigid rigid_of_flat12(const torch::Tensor& flat) {
  return {flat.narrow(-1, 0, 9).unflatten(-1, {3, 3}), flat.narrow(-1, 9, 3)};
}

// The structure labels as a golden batch gives them: "<prefix><name>", sliced at `index` when >= 0 (the
// model's batch repeats them per iteration).
inline StructureLabels golden_structure_labels(const io::NpzArrays& golden, const std::string& prefix, int64_t index = -1) {
  const auto at = [&](const std::string& name) {
    const torch::Tensor& t = golden.at(prefix + name);
    return index >= 0 ? t[index] : t;
  };
  const torch::Tensor affine = at("backbone_affine_tensor");
  StructureLabels labels;
  labels.aatype = at("aatype").to(torch::kInt64);
  labels.residue_mask = at("seq_mask");
  labels.atom14_positions = at("atom14_gt_positions");
  labels.atom14_exists = at("atom14_gt_exists");
  labels.atom14_alt_positions = at("atom14_alt_gt_positions");
  labels.atom14_alt_exists = at("atom14_alt_gt_exists");
  labels.atom14_ambiguous = at("atom14_atom_is_ambiguous");
  labels.atom14_type_exists = at("atom14_atom_exists");
  labels.group_frames = rigid_of_flat12(at("rigidgroups_gt_frames"));
  labels.alt_group_frames = rigid_of_flat12(at("rigidgroups_alt_gt_frames"));
  labels.group_exists = at("rigidgroups_gt_exists");
  labels.backbone = {quaternion_to_rotation(affine.narrow(-1, 0, 4)), affine.narrow(-1, 4, 3)};
  labels.backbone_mask = at("backbone_affine_mask");
  labels.chi_angles = at("chi_angles");
  labels.chi_mask = at("chi_mask");
  labels.clamped_fape_fraction = at("use_clamped_fape").item<double>();
  return labels;
}

// AlphaFold's own residue tables (golden/alphafold_residue_tables.npz, written by alphafold_residue_tables.py),
// float32: the structure module run on them places atoms exactly as AlphaFold does. AlphaFold's default
// frame of a group a residue lacks is all zeros, kept as it is. The tables of atom names for the truth's
// frames and torsions are Kuafu's (the names are AlphaFold's: ResidueGeometryTest).
inline ResidueGeometry alphafold_residue_geometry() {
  const io::NpzArrays tables = io::read_npz(
      (std::filesystem::path(KUAFU_SOURCE_DIR) / "tests/apps/fastfold/golden/alphafold_residue_tables.npz").string());
  const auto longs = [&](const char* name) { return tables.at(name).to(torch::kInt64); };
  const torch::Tensor frames = tables.at("restype_rigid_group_default_frame");  // [21, 8, 4, 4]
  const torch::Tensor renaming = tables.at("renaming_matrices");                // [21, 14, 14]
  const torch::Tensor ambiguous = (renaming.diagonal(0, 1, 2) == 0).to(torch::kFloat32);
  return {{frames.narrow(-2, 0, 3).narrow(-1, 0, 3).contiguous(), frames.narrow(-2, 0, 3).select(-1, 3).contiguous()},
          longs("restype_atom14_to_rigid_group"),
          tables.at("restype_atom14_mask"),
          tables.at("restype_atom14_rigid_group_positions"),
          longs("restype_atom14_to_atom37"),
          longs("restype_atom37_to_atom14"),
          tables.at("restype_atom37_mask"),
          tables.at("chi_angles_mask"),
          tables.at("chi_pi_periodic"),
          ambiguous,
          renaming,
          ideal_residue_geometry().chi_atoms,
          ideal_residue_geometry().group_base_atoms,
          ideal_residue_geometry().group_exists,
          ideal_residue_geometry().group_ambiguous};
}

}  // namespace kuafu::fold::testing
