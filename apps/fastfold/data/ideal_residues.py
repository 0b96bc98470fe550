"""Writes ideal_residues.inc: each heavy atom of the 20 standard amino acids placed in its rigid group's frame
(AlphaFold 2's rigid groups, supplement 1.8 and Table 2), the median over the residues of Debian's full-atom PDB
files (theseus-examples, t-coffee-examples, python3-prody-tests) whose heavy atoms are all present. Within a
rigid group an atom's place is set by bond lengths and angles, which refinement keeps near Engh & Huber's, so
the median is the ideal geometry as real structures show it.

Frames: the backbone group (N, CA, C, CB) has CA at the origin, C on the x axis, N in the xy plane (y > 0); the
psi group (O) has C at the origin, x along CA->C, O in the xy plane; a chi group has the chi angle's third atom
at the origin, x along the second->third bond, the fourth atom in the xy plane. An atom belongs to the last chi
group whose third atom lies nearer CA (by the Greek letter of the names). The chi atoms are those of
residue_types.cpp. Atoms are written in the Chemical Component Dictionary's order (biotite's), OXT left out.

    .venv/bin/python apps/fastfold/data/ideal_residues.py > apps/fastfold/data/ideal_residues.inc
"""
import glob
import gzip
import io
import warnings

import biotite
import biotite.structure as struc
import biotite.structure.info as info
import biotite.structure.io.pdb as pdb
import numpy as np

# The side chain's main branch after N and CA: consecutive fours make the chi angles.
CHI_CHAINS = {
    'ALA': [], 'ARG': ['CB', 'CG', 'CD', 'NE', 'CZ'], 'ASN': ['CB', 'CG', 'OD1'], 'ASP': ['CB', 'CG', 'OD1'],
    'CYS': ['CB', 'SG'], 'GLN': ['CB', 'CG', 'CD', 'OE1'], 'GLU': ['CB', 'CG', 'CD', 'OE1'], 'GLY': [],
    'HIS': ['CB', 'CG', 'ND1'], 'ILE': ['CB', 'CG1', 'CD1'], 'LEU': ['CB', 'CG', 'CD1'],
    'LYS': ['CB', 'CG', 'CD', 'CE', 'NZ'], 'MET': ['CB', 'CG', 'SD', 'CE'], 'PHE': ['CB', 'CG', 'CD1'],
    'PRO': ['CB', 'CG', 'CD'], 'SER': ['CB', 'OG'], 'THR': ['CB', 'OG1'], 'TRP': ['CB', 'CG', 'CD1'],
    'TYR': ['CB', 'CG', 'CD1'], 'VAL': ['CB', 'CG1']}
GREEK = 'ABGDEZH'
FILES = (sorted(glob.glob('/usr/share/doc/theseus/examples/**/*.pdb.gz', recursive=True)) +
         sorted(glob.glob('/usr/share/doc/t-coffee/examples/**/*.pdb.gz', recursive=True)) +
         sorted(glob.glob('/usr/lib/python3/dist-packages/prody/tests/datafiles/*.pdb')))


def in_frame(point, origin, x_towards, y_towards):
    e1 = x_towards / np.linalg.norm(x_towards)
    y = y_towards - e1 * np.dot(e1, y_towards)
    e2 = y / np.linalg.norm(y)
    d = point - origin
    return np.array([d @ e1, d @ e2, d @ np.cross(e1, e2)])


def grouped(residue, pos):
    """{atom: (group, position in the group's frame)} of one residue's atoms {name: xyz}."""
    chain = ['N', 'CA'] + CHI_CHAINS[residue]
    chis = [chain[k:k + 4] for k in range(len(chain) - 3)]
    out = {}
    for atom, p in pos.items():
        if atom == 'O':
            out[atom] = (3, in_frame(p, pos['C'], pos['C'] - pos['CA'], pos['O'] - pos['C']))
        elif atom in ('N', 'CA', 'C', 'CB'):
            out[atom] = (0, in_frame(p, pos['CA'], pos['C'] - pos['CA'], pos['N'] - pos['CA']))
        else:
            k = max(k for k, chi in enumerate(chis) if GREEK.index(atom[1]) > GREEK.index(chi[2][1]))
            a, b, c, d = chis[k]
            out[atom] = (4 + k, in_frame(p, pos[c], pos[c] - pos[b], pos[d] - pos[c]))
    return out


def heavy_atom_names():
    """{residue: its heavy atoms in the Chemical Component Dictionary's order, OXT left out}."""
    return {r: [a for a, e in zip(info.residue(r).atom_name, info.residue(r).element) if e != 'H' and a != 'OXT']
            for r in CHI_CHAINS}


def read_chains():
    """Each readable file's structure (model 1, the likelier altloc), and how many files could not be read."""
    chains, skipped = [], 0
    for path in FILES:
        text = (gzip.open(path, 'rt') if path.endswith('.gz') else open(path)).read()
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            try:
                chains.append(pdb.PDBFile.read(io.StringIO(text)).get_structure(model=1, altloc='occupancy'))
            except ValueError:  # a few files break the format (residue numbers like '271a'): left out
                skipped += 1
    return chains, skipped


def complete_residues(atoms, names):
    """(residue name, {atom: xyz}) of each standard residue of `atoms` whose heavy atoms are all present."""
    for residue in struc.residue_iter(atoms):
        r = residue.res_name[0]
        pos = {a: c.astype(np.float64) for a, c in zip(residue.atom_name, residue.coord)}
        if r in CHI_CHAINS and not residue.hetero[0] and all(a in pos for a in names[r]):
            yield r, {a: pos[a] for a in names[r]}


def main():
    names = heavy_atom_names()
    seen = {r: {a: [] for a in names[r]} for r in CHI_CHAINS}
    groups = {r: {} for r in CHI_CHAINS}
    chains, skipped = read_chains()
    for atoms in chains:
        for r, pos in complete_residues(atoms, names):
            for atom, (group, p) in grouped(r, pos).items():
                seen[r][atom].append(p)
                groups[r][atom] = group
    print(f'// Generated by apps/fastfold/data/ideal_residues.py (biotite {biotite.__version__}, {len(FILES) - skipped} PDB files, '
          f'{skipped} unreadable left out): do not edit.')
    print('// {residue, atom, rigid group, x, y, z}: the atom in its group\'s frame, Å, the median over the residues.')
    for r in CHI_CHAINS:
        print(f'// {r}: {len(seen[r]["N"])} residues')
        for atom in names[r]:
            x, y, z = np.median(np.array(seen[r][atom]), axis=0)
            print(f'{{"{r}", "{atom}", {groups[r][atom]}, {x:.3f}, {y:.3f}, {z:.3f}}},')


if __name__ == '__main__':
    main()
