"""AlphaFold 2.3's structural violations (supplement 1.9.11) on a deformed real chain, written to
golden/alphafold_violations.npz for violations_test.cpp: every term of alphafold.model.folding's
find_structural_violations, its violation metrics, structural_violation_loss at weight 1 and that loss's gradient
with respect to the atom positions; and the within-residue distance bounds AlphaFold derives from Engh & Huber's
table (residue_constants.make_atom14_dists_bounds), which Kuafu's own bounds are compared with.

    AFVENV/bin/python tests/apps/fastfold/alphafold_violation_reference.py tests/apps/fastfold/golden/alphafold_violations.npz
(AFVENV as alphafold_reference.py's docstring makes it; no compilation worth caching: runs in seconds.)

The chain is cytochrome c d1crj from Debian's theseus-examples, 40 residues with a gap in the numbering made
after residue 19. Its atoms are moved so that every term has something to penalise: noise on every atom, one
stretch of residues pulled together (clashes between residues, stretched peptide bonds), one residue's atoms
pushed into each other (within-residue violations). AlphaFold masks the clash of any two atoms in the 14-slot
layout's sixth slot (cysteine's SG) whatever their residues; Kuafu masks only SG-SG pairs of two cysteines, so
the chain is checked to have no other sixth-slot pair near a clash (the script exits if it does).
"""
import gzip
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from alphafold.common import protein
from alphafold.common import residue_constants as rc
from alphafold.model import all_atom_multimer, folding

PDB = '/usr/share/doc/theseus/examples/cytochromes/d1crj__.pdb.gz'
NUM_RES = 40
GAP_AFTER = 19  # residue_index jumps by 3 after this residue: no peptide bond is checked across it


def chain_atom14():
    with gzip.open(PDB, 'rt') as f:
        prot = protein.from_pdb_string(f.read())
    aatype = prot.aatype[:NUM_RES].astype(np.int32)
    a14_to_a37 = all_atom_multimer._make_restype_atom14_to_atom37()[aatype]  # [N, 14]
    exists = rc.restype_atom14_mask[aatype].astype(np.float32)               # [N, 14]
    pos = np.take_along_axis(prot.atom_positions[:NUM_RES], a14_to_a37[..., None], axis=1) * exists[..., None]
    return aatype, exists, pos.astype(np.float64)


def deform(pos, exists, rng):
    pos = pos + rng.normal(0, 0.06, pos.shape)
    # Residues 8-13 pulled 40% of the way towards their centre: their atoms clash with each other's.
    stretch = slice(8, 14)
    centre = (pos[stretch] * exists[stretch, :, None]).sum((0, 1)) / exists[stretch].sum()
    pos[stretch] = centre + 0.6 * (pos[stretch] - centre)
    # Residue 30's side chain squeezed towards its CA: bonds and angles inside it too short.
    pos[30, 4:] = pos[30, 1] + 0.55 * (pos[30, 4:] - pos[30, 1])
    # Residue 25 moved 2 A: its peptide bonds stretched and compressed, a CA-CA distance extreme.
    pos[25] += np.array([2.0, 0.0, 0.0])
    return (pos * exists[..., None]).astype(np.float32)


def check_no_sixth_slot_clash(pos, exists, aatype, residue_index):
    radius = np.array([[rc.van_der_waals_radius[n[0]] if n else 0.0
                        for n in rc.restype_name_to_atom14_names[rc.restype_1to3[rc.restypes[a]]]] for a in aatype])
    cys = rc.restype_order['C']
    for i in range(len(aatype)):
        for j in range(len(aatype)):
            if residue_index[i] >= residue_index[j] or not (exists[i, 5] and exists[j, 5]):
                continue
            if aatype[i] == cys and aatype[j] == cys:
                continue
            d = np.linalg.norm(pos[i, 5] - pos[j, 5])
            if d < radius[i, 5] + radius[j, 5] - 1.5 + 0.5:
                raise SystemExit(f'residues {i} and {j}: sixth-slot atoms {d:.2f} A apart, AlphaFold would mask it')


def main(out):
    rng = np.random.RandomState(7)
    aatype, exists, pos = chain_atom14()
    residue_index = np.arange(NUM_RES, dtype=np.int32)
    residue_index[GAP_AFTER + 1:] += 2
    pos = deform(pos, exists, rng)
    check_no_sixth_slot_clash(pos, exists, aatype, residue_index)
    seq_mask = np.ones(NUM_RES, np.float32)
    batch = {'aatype': jnp.asarray(aatype), 'residue_index': jnp.asarray(residue_index),
             'atom14_atom_exists': jnp.asarray(exists), 'seq_mask': jnp.asarray(seq_mask),
             'residx_atom14_to_atom37': jnp.asarray(all_atom_multimer._make_restype_atom14_to_atom37()[aatype])}
    config = ml_collections.ConfigDict({
        'violation_tolerance_factor': 12.0, 'clash_overlap_tolerance': 1.5,
        'structural_violation_loss_weight': 1.0, 'sidechain': {'weight_frac': 0.5}})

    def loss(p):
        ret = {'loss': 0.0}
        folding.structural_violation_loss(ret, batch, {'violations': folding.find_structural_violations(batch, p, config)},
                                          config)
        return ret['loss']

    p = jnp.asarray(pos)
    violations = folding.find_structural_violations(batch, p, config)
    metrics = folding.compute_violation_metrics(batch, p, violations)
    bounds = rc.make_atom14_dists_bounds(overlap_tolerance=1.5, bond_length_tolerance_factor=12.0)
    arrays = {'in/aatype': aatype, 'in/residue_index': residue_index, 'in/atom14_positions': pos,
              'in/atom14_exists': exists, 'in/seq_mask': seq_mask,
              'bounds/lower': bounds['lower_bound'], 'bounds/upper': bounds['upper_bound'],
              'bounds/stddev': bounds['stddev'],
              'out/loss': loss(p), 'grad/atom14_positions': jax.grad(loss)(p),
              'out/total_per_residue_violations_mask': violations['total_per_residue_violations_mask']}
    for group in ('between_residues', 'within_residues'):
        for k, v in violations[group].items():
            arrays[f'out/{group}/{k}'] = v
    for k, v in metrics.items():
        arrays[f'metrics/{k}'] = v
    for k, v in arrays.items():
        print(k, np.shape(v), float(np.sum(np.asarray(v, np.float64))))
    np.savez(out, **{k: np.asarray(v, np.int32 if np.asarray(v).dtype.kind in 'iub' else np.float32)
                     for k, v in arrays.items()})


if __name__ == '__main__':
    main(sys.argv[1])
