"""AlphaFold 2.3's residue tables (alphafold.common.residue_constants and all_atom's renaming, as
alphafold-colabfold 2.3.27 ships them), written to golden/alphafold_residue_tables.npz for
residue_geometry_test.cpp: Kuafu's own tables (apps/fastfold/residue_types.cpp, from the PDB Chemical Component
Dictionary) are compared with them, and the structure module is run on them to equal AlphaFold's outputs.

    AFVENV/bin/python tests/apps/fastfold/alphafold_residue_tables.py tests/apps/fastfold/golden/alphafold_residue_tables.npz
(AFVENV as alphafold_reference.py's docstring makes it.)
"""
import sys

import numpy as np
from alphafold.common import residue_constants as rc
from alphafold.model import all_atom_multimer, all_atom


def main(out):
    a14_to_a37 = all_atom_multimer._make_restype_atom14_to_atom37()
    a37_to_a14 = all_atom_multimer._make_restype_atom37_to_atom14()
    tables = {
        'restype_rigid_group_default_frame': rc.restype_rigid_group_default_frame,  # [21, 8, 4, 4]
        'restype_atom14_to_rigid_group': rc.restype_atom14_to_rigid_group,  # [21, 14]
        'restype_atom14_mask': rc.restype_atom14_mask,  # [21, 14]
        'restype_atom14_rigid_group_positions': rc.restype_atom14_rigid_group_positions,  # [21, 14, 3]
        'restype_atom37_mask': rc.restype_atom37_mask,  # [21, 37]
        'restype_atom14_to_atom37': a14_to_a37,  # [21, 14]
        'restype_atom37_to_atom14': a37_to_a14,  # [21, 37]
        'chi_angles_mask': np.asarray(rc.chi_angles_mask + [[0.0] * 4]),  # [21, 4]
        'chi_pi_periodic': np.asarray(rc.chi_pi_periodic),  # [21, 4]
        'renaming_matrices': all_atom.RENAMING_MATRICES,  # [21, 14, 14]
    }
    np.savez(out, **{k: np.asarray(v, np.int32 if np.asarray(v).dtype.kind in 'iub' else np.float32)
                     for k, v in tables.items()})


if __name__ == '__main__':
    main(sys.argv[1])
