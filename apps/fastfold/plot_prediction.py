"""A predicted structure beside its truth, for a person to judge (apps/fastfold/demo.sh, docs/fastfold.md):
the Cα traces after the least-squares superposition (two projections), the Cα contact maps (< 8 Å; the
prediction above the diagonal, the truth below) and pLDDT along the chain (the predicted PDB's B-factors).

    .venv/bin/python apps/fastfold/plot_prediction.py PREDICTED.pdb TRUTH.pdb OUT.png
"""
import sys

import biotite.structure as struc
import biotite.structure.io.pdb as pdb
import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def ca_atoms(path):
    atoms = pdb.PDBFile.read(path).get_structure(model=1, extra_fields=['b_factor'])
    return atoms[atoms.atom_name == 'CA']


def main(predicted_path, truth_path, out):
    predicted, truth = ca_atoms(predicted_path), ca_atoms(truth_path)
    assert len(predicted) == len(truth), 'the two files have different residues'
    fitted, _ = struc.superimpose(truth, predicted)
    rmsd = struc.rmsd(truth, fitted)
    fig, axes = plt.subplots(1, 4, figsize=(20, 5))
    for ax, (i, j) in zip(axes[:2], [(0, 1), (0, 2)]):
        ax.plot(truth.coord[:, i], truth.coord[:, j], '-o', ms=2, lw=1, color='tab:gray', label='truth')
        ax.plot(fitted.coord[:, i], fitted.coord[:, j], '-o', ms=2, lw=1, color='tab:blue', label='predicted')
        ax.set_aspect('equal')
        ax.set_xlabel('xyz'[i] + ' (Å)')
        ax.set_ylabel('xyz'[j] + ' (Å)')
        ax.legend(loc='best')
    axes[0].set_title(f'Cα traces superposed (RMSD {rmsd:.2f} Å)')
    contacts = lambda c: np.linalg.norm(c[:, None] - c[None], axis=-1) < 8.0  # noqa: E731
    shown = np.where(np.triu(np.ones((len(truth), len(truth)), bool)), contacts(fitted.coord), contacts(truth.coord))
    axes[2].imshow(shown, cmap='Greys', origin='upper')
    axes[2].set_title('Cα contacts < 8 Å: predicted (upper), true (lower)')
    axes[3].plot(predicted.res_id, predicted.b_factor, color='tab:orange')
    axes[3].set_ylim(0, 100)
    axes[3].set_xlabel('residue')
    axes[3].set_ylabel('pLDDT')
    axes[3].set_title('predicted confidence')
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(out)


if __name__ == '__main__':
    main(*sys.argv[1:4])
