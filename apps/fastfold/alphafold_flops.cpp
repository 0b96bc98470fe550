#include "apps/fastfold/alphafold_flops.h"

#include "apps/fastfold/embedders.h"
#include "apps/fastfold/residue_types.h"

namespace kuafu::fold {

namespace {

// [n, in] x [in, out].
double linear(double n, double in, double out) { return 2 * n * in * out; }

// nn::GatedAttention over `batch` rows of `length` positions of width `width` (however many heads: they split
// the width): query, key, value and gate projections, logits and average, output projection.
double gated_attention(double batch, double length, double width) {
  const double n = batch * length;
  return 4 * linear(n, width, width) + 2 * (2 * batch * length * length * width) + linear(n, width, width);
}

// The extra MSA stack's global column attention: one query per residue, keys and values of one head's width.
double global_column_attention(double rows, double residues, double width, double heads) {
  const double head = width / heads, n = rows * residues;
  return linear(residues, width, width) + 2 * linear(n, width, head) + 2 * (2 * residues * heads * rows * head) +
         linear(n, width, width) + linear(n, width, width);
}

}  // namespace

double evoformer_block_flops(const EvoformerSizes& s, int64_t rows_, int64_t residues_) {
  const double S = static_cast<double>(rows_), R = static_cast<double>(residues_), R2 = R * R;
  const double c_m = static_cast<double>(s.msa_channels), c_z = static_cast<double>(s.pair_channels);
  const double c_o = static_cast<double>(s.outer_channels), c_t = static_cast<double>(s.triangle_channels);
  const double n = static_cast<double>(s.transition_factor);
  const double h_m = static_cast<double>(s.msa_heads), h_z = static_cast<double>(s.pair_heads);
  const double row_attention = linear(R2, c_z, h_m) + gated_attention(S, R, c_m);
  const double column_attention =
      s.global_column_attention ? global_column_attention(S, R, c_m, h_m) : gated_attention(R, S, c_m);
  const double msa_transition = 2 * linear(S * R, c_m, n * c_m);
  // Projections, the outer products summed over rows, their projection to c_z, the count of rows per pair.
  const double outer_product_mean = 2 * linear(S * R, c_m, c_o) + 2 * S * R2 * c_o * c_o + linear(R2, c_o * c_o, c_z) + 2 * S * R2;
  // Projections and gates, the output gate, Σ_k a_ik b_jk, the output projection.
  const double triangle_multiplication = 4 * linear(R2, c_z, c_t) + linear(R2, c_z, c_z) + 2 * R2 * R * c_t + linear(R2, c_t, c_z);
  const double triangle_attention = linear(R2, c_z, h_z) + gated_attention(R, R, c_z);
  const double pair_transition = 2 * linear(R2, c_z, n * c_z);
  return row_attention + column_attention + msa_transition + outer_product_mean + 2 * triangle_multiplication +
         2 * triangle_attention + pair_transition;
}

double alphafold_iteration_flops(const AlphaFoldSizes& sizes, const FoldShape& shape) {
  const double R = static_cast<double>(shape.residues), R2 = R * R;
  const double S = static_cast<double>(shape.msa_rows), E = static_cast<double>(shape.extra_rows);
  const double c_m = static_cast<double>(sizes.msa_channels), c_z = static_cast<double>(sizes.pair_channels);
  const double c_s = static_cast<double>(sizes.single_channels), c_e = static_cast<double>(sizes.extra_msa_channels);
  // The relative positions' one-hot product is a row lookup (embedders.cpp): no product to count.
  const double embed = linear(R, kTargetFeatures, c_m) + linear(S * R, kMsaFeatures, c_m) + 2 * linear(R, kTargetFeatures, c_z) +
                       linear(R2, static_cast<double>(sizes.recycle_bins), c_z) + linear(E * R, kExtraMsaFeatures, c_e);
  const double stacks = static_cast<double>(sizes.extra_msa_blocks) * evoformer_block_flops(sizes.extra_msa(), shape.extra_rows, shape.residues) +
                        static_cast<double>(sizes.evoformer_blocks) * evoformer_block_flops(sizes.evoformer(), shape.msa_rows, shape.residues);

  const StructureModuleSizes& st = sizes.structure;
  const IpaSizes& ipa = st.ipa;
  const double c = static_cast<double>(ipa.single_channels), h = static_cast<double>(ipa.heads);
  const double qk = static_cast<double>(ipa.scalar_qk), v = static_cast<double>(ipa.scalar_v);
  const double pqk = static_cast<double>(ipa.point_qk), pv = static_cast<double>(ipa.point_v);
  // Scalar and point projections, q·k, the pair bias, the attention over values, points and the pair, the output.
  const double attention = linear(R, c, h * qk) + linear(R, c, h * (qk + v)) + linear(R, c, h * 3 * pqk) +
                           linear(R, c, h * 3 * (pqk + pv)) + 2 * h * R2 * qk + linear(R2, c_z, h) + 2 * h * R2 * v +
                           2 * h * R2 * pv * 3 + 2 * h * R2 * c_z + linear(R, h * (v + 4 * pv + c_z), c);
  const double a = static_cast<double>(st.angle_channels);
  const double angles = linear(R, c, a) + linear(R, c_s, a) + static_cast<double>(st.angle_blocks) * 2 * linear(R, a, a) +
                        linear(R, a, 2 * kTorsions);
  const double layer = attention + static_cast<double>(st.transition_layers) * linear(R, c, c) + linear(R, c, 6) + angles;
  const double structure = linear(R, c_m, c_s) + linear(R, c_s, c) + static_cast<double>(st.layers) * layer;

  const double p = static_cast<double>(sizes.plddt_channels);
  const double heads = linear(R2, c_z, static_cast<double>(sizes.distogram_bins)) +
                       linear(S * R, c_m, static_cast<double>(sizes.msa_classes)) + linear(R, c, p) + linear(R, p, p) +
                       linear(R, p, static_cast<double>(sizes.plddt_bins)) +
                       (sizes.experimentally_resolved_head ? linear(R, c_s, kAtom37) : 0.0);
  return embed + stacks + structure + heads;
}

double alphafold_training_flops(const AlphaFoldSizes& sizes, const FoldShape& shape, double iterations) {
  return (iterations + 2) * alphafold_iteration_flops(sizes, shape);
}

}  // namespace kuafu::fold
