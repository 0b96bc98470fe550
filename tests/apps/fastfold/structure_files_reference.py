"""biotite's reading of PDB, mmCIF and FASTA files, the reference of structure_files_test.cpp.

Run with the checkout's venv (biotite is pinned in scripts/python/requirements.txt):
    structure_files_reference.py OUT_DIR
reads OUT_DIR/inputs.txt, one input a line, "<kind> <path>":
    pdb PATH      -> OUT_DIR/<n>.tsv: the first model's atoms as biotite reads them (altloc="all"), after
                     the rules of apps/fastfold/pdb_file.h written out here again (waters, altlocs,
                     microheterogeneity, MSE); <n>.json: the model count, SEQRES and REMARK 465 (the
                     residues the file says are missing, model 1; whether it has the table) per chain
    cif PATH      -> the same from biotite's CIF tokenizer (_atom_site's columns: auth chain and number,
                     label residue and atom names), with _pdbx_poly_seq_scheme's sequences
    convert PATH  -> <n>.cif: a PDB file (every model) written as mmCIF by biotite's set_structure
    fasta PATH    -> <n>.json: biotite's FastaFile headers and sequences
where <n> is the input's line number (from 0). A file biotite cannot read gets <n>.error with its
message instead. Writes OUT_DIR/done last.
"""
import gzip
import io
import json
import os
import sys
import warnings

import numpy as np
import biotite.sequence.io.fasta as fasta
import biotite.structure.io.pdb as pdb
import biotite.structure.io.pdbx as pdbx

WATERS = ('HOH', 'WAT')


def read_text(path):
    if path.endswith('.gz'):
        with gzip.open(path, 'rt') as f:
            return f.read()
    with open(path) as f:
        return f.read()


def apply_rules(atoms):
    """atoms: dicts in file order -> {chain: [residue]}, chains in order of first appearance."""
    chains = {}
    current = None  # (chain, number, insertion code, name as read, residue)
    for a in atoms:
        if a['hetero'] and a['res_name'] in WATERS:
            continue
        same = (current is not None and current[:3] == (a['chain'], a['number'], a['icode']))
        if same and a['res_name'] != current[3]:
            if a['altloc']:
                continue  # an alternative residue: the first one read stays
            same = False
        name, hetero, atom_name = a['res_name'], a['hetero'], a['atom']
        if name == 'MSE':
            name, hetero = 'MET', False
            atom_name = 'SD' if atom_name == 'SE' else atom_name
        if not same:
            residue = {'name': name, 'number': a['number'], 'icode': a['icode'], 'hetero': hetero, 'atoms': {}}
            chains.setdefault(a['chain'], []).append(residue)
            current = (a['chain'], a['number'], a['icode'], a['res_name'], residue)
        kept = current[4]['atoms']
        atom = dict(a, atom=atom_name)
        # Highest occupancy, the first on ties; a dict keeps the first one's place.
        if atom_name not in kept or a['occupancy'] > kept[atom_name]['occupancy']:
            kept[atom_name] = atom
    return chains


def write_tsv(path, chains):
    with open(path, 'w') as out:
        for chain, residues in chains.items():
            for r in residues:
                for a in r['atoms'].values():
                    # repr: each value exactly (biotite's float32 coordinates included)
                    out.write('\t'.join([
                        chain, str(r['number']), r['icode'] or ' ', r['name'], str(int(r['hetero'])), a['atom'],
                        a['element'], *(repr(v) for v in a['coord']),
                        repr(a['occupancy']), repr(a['b_factor'])]) + '\n')


def pdb_reference(path, out):
    text = read_text(path)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # "elements were guessed from atom name"
        f = pdb.PDBFile.read(io.StringIO(text))
        array = f.get_structure(model=1, altloc='all', extra_fields=['occupancy', 'b_factor'])
        models = f.get_model_count()
    columns = zip(array.chain_id.tolist(), array.res_id.tolist(), array.ins_code.tolist(), array.res_name.tolist(),
                  array.hetero.tolist(), array.atom_name.tolist(), array.element.tolist(), array.altloc_id.tolist(),
                  array.coord.tolist(), array.occupancy.tolist(), array.b_factor.tolist())
    atoms = [{
        'chain': chain, 'number': number, 'icode': icode, 'res_name': res_name, 'hetero': hetero, 'atom': atom,
        'element': element.upper(), 'altloc': altloc.strip(), 'coord': coord, 'occupancy': occupancy,
        'b_factor': b_factor,
    } for chain, number, icode, res_name, hetero, atom, element, altloc, coord, occupancy, b_factor in columns]
    write_tsv(out + '.tsv', apply_rules(atoms))

    # SEQRES and REMARK 465 read here as plain text: biotite reads neither.
    seqres, missing = {}, {}
    in_table = False  # REMARK 465's table, when the file has one
    for line in text.splitlines():
        if line.startswith('SEQRES'):
            names = ['MET' if n == 'MSE' else n for n in line[19:].split()]
            seqres.setdefault(line[11].strip(), []).extend(names)
        elif line.startswith('REMARK 465'):
            fields = line[10:].split()
            if fields[:4] == ['M', 'RES', 'C', 'SSSEQI']:
                in_table = True
            elif in_table and len(fields) in (3, 4):
                if len(fields) == 4 and fields.pop(0) != '1':
                    continue  # another model's
                name, chain, number = fields
                icode = number[-1] if number[-1].isalpha() else ' '
                missing.setdefault(chain, []).append(
                    ['MET' if name == 'MSE' else name, int(number.rstrip(icode) if icode != ' ' else number), icode])
    with open(out + '.json', 'w') as f:
        json.dump({'models': models, 'seqres': seqres, 'remark465': in_table, 'missing': missing}, f)


def cif_reference(path, out):
    block = pdbx.CIFFile.read(io.StringIO(read_text(path))).block
    site = block['atom_site']

    def column(name, default=None):
        if name not in site:
            return [default] * site.row_count
        return [None if v in ('.', '?') else v for v in site[name].as_array(str)]

    models = column('pdbx_PDB_model_num', '1')
    first = models[0]
    names = zip(column('auth_asym_id'), column('auth_seq_id'), column('pdbx_PDB_ins_code'), column('label_comp_id'),
                column('group_PDB'), column('label_atom_id'), column('type_symbol'), column('label_alt_id'),
                column('Cartn_x'), column('Cartn_y'), column('Cartn_z'), column('occupancy', '1'),
                column('B_iso_or_equiv', '0'), models)
    atoms = [{
        'chain': chain, 'number': int(number), 'icode': icode or '', 'res_name': res_name, 'hetero': group == 'HETATM',
        'atom': atom, 'element': (element or '').upper(), 'altloc': altloc or '',
        'coord': [float(x), float(y), float(z)], 'occupancy': float(occupancy), 'b_factor': float(b),
    } for chain, number, icode, res_name, group, atom, element, altloc, x, y, z, occupancy, b, model in names
      if model == first]
    write_tsv(out + '.tsv', apply_rules(atoms))

    # Each strand's sequence (the first row of a seq_id given twice) and which positions were observed
    # (auth_seq_num '?': not in the structure).
    sequences = {}
    if 'pdbx_poly_seq_scheme' in block:
        scheme = block['pdbx_poly_seq_scheme']
        rows = zip(*(scheme[k].as_array(str) for k in ('pdb_strand_id', 'asym_id', 'seq_id', 'mon_id',
                                                         'auth_seq_num')))
        last = None
        for strand, asym, seq_id, mon, auth in rows:
            if (asym, seq_id) == last:
                continue
            last = (asym, seq_id)
            entry = sequences.setdefault(strand, {'asym': asym, 'names': [], 'observed': []})
            if entry['asym'] != asym:
                continue  # a strand's first polymer only
            entry['names'].append('MET' if mon == 'MSE' else mon)
            entry['observed'].append(auth not in ('?', '.'))
    with open(out + '.json', 'w') as f:
        json.dump({'models': len(set(models)), 'sequences': sequences}, f)


def convert(path, out):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        stack = pdb.PDBFile.read(io.StringIO(read_text(path))).get_structure(extra_fields=['occupancy', 'b_factor'])
    cif = pdbx.CIFFile()
    pdbx.set_structure(cif, stack)
    cif.write(out + '.cif')


def fasta_reference(path, out):
    f = fasta.FastaFile.read(io.StringIO(read_text(path)))
    with open(out + '.json', 'w') as o:
        json.dump({'descriptions': list(f.keys()), 'sequences': list(f.values())}, o)


def main():
    out_dir = sys.argv[1]
    readers = {'pdb': pdb_reference, 'cif': cif_reference, 'convert': convert, 'fasta': fasta_reference}
    with open(os.path.join(out_dir, 'inputs.txt')) as f:
        inputs = [line.rstrip('\n').split(' ', 1) for line in f if line.strip()]
    for n, (kind, path) in enumerate(inputs):
        out = os.path.join(out_dir, str(n))
        try:
            readers[kind](path, out)
        except (ValueError, KeyError, IndexError) as e:  # a file biotite refuses
            with open(out + '.error', 'w') as f:
                f.write(f'{type(e).__name__}: {e}\n')
    print(f'biotite {__import__("biotite").__version__}, numpy {np.__version__}: {len(inputs)} inputs')
    open(os.path.join(out_dir, 'done'), 'w').close()


if __name__ == '__main__':
    main()
