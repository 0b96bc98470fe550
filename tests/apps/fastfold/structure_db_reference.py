"""ProMod3's own reading of its structure database, the reference of structure_db_test.cpp.

Run with Debian's /usr/bin/python3 (python3-promod3; not the venv):
    structure_db_reference.py DB OUT_DIR CHAIN_INDEX...
writes OUT_DIR/reference.json: the chain count and, for each chain asked, what StructureDB.Load gives.
Backbones are ProMod3's (GetBackboneList, in the stored frame) with CoordInfo.shift subtracted.

That subtraction is checked here too: a one-chain database that AddCoordinates builds from backbone
atoms at known coordinates (chain 0's first residues moved into negative coordinates) is saved as
OUT_DIR/shift_probe.dat, and those coordinates go into reference.json as the probe's "backbone".
"""
import json
import os
import sys

from ost import conop, io, seq
from promod3 import loop

ATOMS = ('N', 'CA', 'C', 'O')


def backbone(bb, shift):
    getters = (bb.GetN, bb.GetCA, bb.GetC, bb.GetO)
    return [[[get(i)[k] - shift[k] for k in range(3)] for get in getters] for i in range(len(bb))]


def profile(prof):
    return [[column.GetFreq(a) for a in 'ACDEFGHIKLMNPQRSTVWY'] for column in prof.columns]


def chain_reference(db, index):
    info = db.GetCoordInfo(index)
    shift = [info.shift[k] for k in range(3)]
    return {
        'index': index,
        'pdb_id': info.id,
        'chain_name': info.chain_name,
        'offset': info.offset,
        'size': info.size,
        'start_resnum': info.start_resnum,
        'shift': shift,
        'sequence': db.GetSequence(index),
        'dssp': db.GetDSSPStates(index),
        'phi_psi': [list(angles) for angles in db.GetDihedralAngles(index)],
        'backbone': backbone(db.GetBackboneList(index), shift),
        'sequence_profile': profile(db.GetSequenceProfile(index)),
        'structure_profile': profile(db.GetStructureProfile(index)),
    }


def shift_probe(db, path, residues=40, offset=(-100.0, 50.0, 30.0)):
    bb = db.GetBackboneList(0)
    sequence = db.GetSequence(0)[:residues]
    lines = []
    for i, olc in enumerate(sequence):
        name3 = conop.OneLetterCodeToResidueName(olc)
        for atom, pos in zip(ATOMS, (bb.GetN(i), bb.GetCA(i), bb.GetC(i), bb.GetO(i))):
            x, y, z = (pos[k] + offset[k] for k in range(3))
            lines.append('ATOM  %5d  %-3s %3s A%4d    %8.3f%8.3f%8.3f  1.00  0.00           %s'
                         % (len(lines) + 1, atom, name3, i + 1, x, y, z, atom[0]))
    entity = io.PDBStrToEntity('\n'.join(lines) + '\nEND\n', io.profiles['DEFAULT'], True)
    probe = loop.StructureDB(loop.StructureDBDataType.Minimal)
    probe.AddCoordinates('PRB1', 'A', entity, seq.CreateSequence('A', sequence))
    probe.Save(path)
    residues_in = [r for r in entity.residues]
    return {
        'sequence': sequence,
        'backbone': [[[r.FindAtom(a).pos[k] for k in range(3)] for a in ATOMS] for r in residues_in],
    }


def main():
    db_path, out_dir = sys.argv[1], sys.argv[2]
    indices = [int(i) for i in sys.argv[3:]]
    db = loop.StructureDB.Load(db_path)
    reference = {
        'num_chains': db.GetNumCoords(),
        'chains': [chain_reference(db, i) for i in indices],
        'shift_probe': shift_probe(db, os.path.join(out_dir, 'shift_probe.dat')),
    }
    with open(os.path.join(out_dir, 'reference.json'), 'w') as out:
        json.dump(reference, out)


if __name__ == '__main__':
    main()
