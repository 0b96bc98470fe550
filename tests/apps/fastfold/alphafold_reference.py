"""AlphaFold 2.3's own JAX/Haiku code (alphafold-colabfold 2.3.27) run on a tiny model: the reference that
apps/fastfold's modules are proven equal to, module by module (issue 52).

Run with its own venv (not the checkout's .venv: JAX, Haiku and AlphaFold are not in
scripts/python/requirements.txt):
    python3 -m venv AFVENV
    AFVENV/bin/pip install alphafold-colabfold==2.3.27 "jax[cpu]"
    AFVENV/bin/pip install --no-deps colabfold-kernels      # imported by alphafold.model.modules, undeclared
    AFVENV/bin/python alphafold_reference.py OUT_DIR --cache CACHE_DIR

Writes, into OUT_DIR (float32 and int32 arrays only; every name and shape is listed in OUT_DIR/manifest.json):
    params/params_model_tiny.npz  the tiny model's parameters, laid out as DeepMind's params_model_*.npz:
                                  'alphafold/alphafold_iteration/<module path>//<name>', triangle multiplication
                                  projections and gates apart (left_/right_projection, left_/right_gate,
                                  layer_norm_input, center_layer_norm), the Evoformer and extra-MSA blocks stacked
                                  on a leading [num_block] axis; every entry is haiku's initial value plus noise, so
                                  no element is 0 or 1. alphafold.model.data.get_model_haiku_params('model_tiny',
                                  OUT_DIR, fuse=False) reads it back, and the references below are run on what it
                                  reads.
    modules.npz      each Evoformer module alone, on block 0's parameters
    evoformer.npz    one Evoformer iteration (block 0) and one extra-MSA-stack iteration (block 0)
    structure.npz    invariant point attention; the structure module with its losses
    model.npz        the whole model with recycling on a real chain's crop: features, per-iteration recycled
                     values, the last iteration's outputs and the losses
    grads.npz        d(total loss)/d(parameter) for every parameter, keyed as params_model_tiny.npz
    config.json      the model and data config used, the sizes, and the loss weights
    manifest.json    {file: {key: [shape, dtype]}}, the script's hash and its arguments; written last
    timings.json     seconds per stage (tracing + compiling + running)

Key scheme of modules.npz / evoformer.npz / structure.npz, for a test T:
    T/in/<name>        inputs (masks as float32 0/1)
    T/out/<name>       outputs; a module's output is its update (DeepMind's dropout_wrapper adds the residual),
                       an Evoformer iteration's output is the new activations
    T/dout/<name>      the cotangent fed back (fixed random normal), or none where the output is a loss
    T/grad/<name>      d<out, dout>/d(input)  (or d(loss)/d(input))
    T/dparam/<key>     d<out, dout>/d(parameter), <key> the full params_model_tiny.npz key; for a block's module
                       the gradient of block 0's slice (no leading block axis)

The model is AlphaFold's, configured (bfloat16=False, deterministic=True, zero_init=False, subbatch_size set,
the triangle multiplications unfused as DeepMind's monomer models run them, the outer product mean in DeepMind's
association) so that it computes DeepMind's v2.3.2 monomer model in float32; ColabFold's AlphaFold wrapper is not
used (it runs one iteration, and compute_loss=True fails through it): AlphaFoldIteration is recycled here,
stop_gradient between iterations, the loss on the last one, prev at the model's sizes.

XLA compiles for minutes on 2 cores: the script runs single-threaded, caches compilations in --cache, and exits
at once when OUT_DIR/manifest.json says it was made by this script with the same arguments (--force remakes it).
"""
import argparse
import gzip
import hashlib
import json
import os
import sys
import time

DEFAULT_PDB = '/usr/share/doc/theseus/examples/cytochromes/d1crj__.pdb.gz'  # Debian's theseus-examples


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('out_dir')
    p.add_argument('--cache', required=True, help="JAX's persistent compilation cache directory")
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--pdb', default=DEFAULT_PDB, help='PDB file (.gz allowed) of the chain to crop')
    p.add_argument('--chain', default=None, help='chain id (default: the first)')
    p.add_argument('--crop-start', type=int, default=0, help='first residue (0-based) of the crop')
    p.add_argument('--num-res', type=int, default=24)
    p.add_argument('--num-msa', type=int, default=6, help='MSA cluster rows the model sees')
    p.add_argument('--num-extra-msa', type=int, default=5)
    p.add_argument('--num-raw-msa', type=int, default=10,
                   help='rows of the synthetic alignment, query included (10: the extra MSA keeps a padded row)')
    p.add_argument('--num-recycle', type=int, default=2, help='iterations = num_recycle + 1')
    p.add_argument('--stage', choices=['initial', 'finetune'], default='initial',
                   help='initial training: violation and experimentally-resolved losses off; finetune: 1.0, 0.01')
    p.add_argument('--use-clamped-fape', type=float, default=0.9,
                   help='batch["use_clamped_fape"]: 0.9 mixes the clamped and unclamped backbone FAPE as the '
                        'expectation over training batches does (each batch draws 0 or 1)')
    p.add_argument('--model-only', action='store_true',
                   help='only the parameters, the whole model (model.npz) and its gradients (grads.npz)')
    p.add_argument('--force', action='store_true')
    return p.parse_args(argv)


ARGS = parse_args() if __name__ == '__main__' else None

# Before jax is imported: one CPU device, single-threaded XLA and Eigen.
os.environ['JAX_PLATFORMS'] = 'cpu'
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1'
                           ' --xla_force_host_platform_device_count=1').strip()
for _v in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS'):
    os.environ.setdefault(_v, '1')

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import haiku as hk  # noqa: E402

jax.config.update('jax_enable_x64', False)
jax.config.update('jax_default_matmul_precision', 'highest')

from alphafold.common import confidence, protein, residue_constants as rc  # noqa: E402
from alphafold.data import parsers, pipeline  # noqa: E402
from alphafold.model import (all_atom, config as af_config, data as af_data, features as af_features,  # noqa: E402
                             folding, modules, prng, quat_affine, r3)

# ColabFold folds the outer product mean's output weights into its right side first when the MSA has at most 16
# rows (the same sum, another rounding); 0 keeps DeepMind's order (compute_chunk: 'acb,ade->dceb', 'dceb,cef->dbf').
modules.OPM_REASSOCIATE_ROWS = 0

EVO = 'alphafold/alphafold_iteration/evoformer'
PARAMS_NAME = 'model_tiny'


# ----------------------------------------------------------------------------------------------------- config
def tiny_config(args):
    cfg = af_config.model_config('model_5')  # monomer, no templates
    with cfg.unlocked():
        d = cfg.data
        d.common.max_extra_msa = args.num_extra_msa
        d.common.num_recycle = args.num_recycle
        d.common.use_templates = False
        d.common.reduce_msa_clusters_by_max_templates = False
        d.common.resample_msa_in_recycling = True
        d.eval.max_msa_clusters = args.num_msa
        d.eval.max_templates = 0
        d.eval.num_ensemble = 1

        m = cfg.model
        m.num_recycle = args.num_recycle
        m.resample_msa_in_recycling = True
        e = m.embeddings_and_evoformer
        e.evoformer_num_block = 2
        e.extra_msa_stack_num_block = 1
        e.msa_channel = 16
        e.pair_channel = 8
        e.seq_channel = 16
        e.extra_msa_channel = 8
        e.template.enabled = False
        ev = e.evoformer
        ev.msa_row_attention_with_pair_bias.num_head = 2
        ev.msa_column_attention.num_head = 2
        ev.outer_product_mean.num_outer_channel = 4
        for k in ('triangle_multiplication_outgoing', 'triangle_multiplication_incoming'):
            ev[k].num_intermediate_channel = 8
            ev[k].fuse_projection_weights = False  # DeepMind's monomer models (v2.3.2 config.py CONFIG_DIFFS)
        ev.triangle_attention_starting_node.num_head = 2
        ev.triangle_attention_ending_node.num_head = 2

        g = m.global_config
        g.bfloat16 = False
        g.bfloat16_output = False
        g.deterministic = True
        g.zero_init = False
        g.subbatch_size = 4
        g.use_remat = False
        g.use_pallas = False
        g.eval_dropout = False
        g.multimer_mode = False

        h = m.heads
        s = h.structure_module
        s.num_layer = 2
        s.num_channel = 16
        s.num_head = 2
        s.num_scalar_qk = 4
        s.num_scalar_v = 4
        s.num_point_qk = 2
        s.num_point_v = 3
        s.num_layer_in_transition = 3
        s.sidechain.num_channel = 8
        s.sidechain.num_residual_block = 2
        h.predicted_lddt.num_channels = 8
        h.predicted_aligned_error.weight = 0.0
        if args.stage == 'initial':  # Jumper et al. (2021) Suppl. Table 4
            s.structural_violation_loss_weight = 0.0
            h.experimentally_resolved.weight = 0.0
        else:
            s.structural_violation_loss_weight = 1.0
            h.experimentally_resolved.weight = 0.01
    return cfg


# --------------------------------------------------------------------------------------------------- features
def load_chain(args):
    with (gzip.open(args.pdb, 'rt') if args.pdb.endswith('.gz') else open(args.pdb)) as f:
        prot = protein.from_pdb_string(f.read(), args.chain)
    sl = slice(args.crop_start, args.crop_start + args.num_res)
    aatype = prot.aatype[sl].astype(np.int32)
    if len(aatype) != args.num_res:
        raise SystemExit(f'the chain has {len(prot.aatype)} residues: no crop of {args.num_res} at {args.crop_start}')
    pos = prot.atom_positions[sl].astype(np.float32)
    mask = prot.atom_mask[sl].astype(np.float32)
    # A disordered side chain, as crystal structures have them: the last two heavy atoms of the first lysine (or of
    # the first residue with a side chain that long) are left out of the truth.
    for i, a in enumerate(aatype):
        names = rc.restype_name_to_atom14_names[rc.restype_1to3[rc.restypes[a]]]
        names = [n for n in names if n]
        if len(names) >= 8:
            for n in names[-2:]:
                mask[i, rc.atom_order[n]] = 0.
                pos[i, rc.atom_order[n]] = 0.
            break
    return dict(aatype=aatype, residue_index=prot.residue_index[sl].astype(np.int32), all_atom_positions=pos,
                all_atom_mask=mask)


def synthetic_msa(query, n_rows, rng):
    """An a3m-like alignment: the query, then homologs with substitutions, gaps, ragged ends and insertions."""
    aas = rc.restypes
    seqs, dels, descs = [query], [[0] * len(query)], ['query']
    for r in range(1, n_rows):
        identity = rng.uniform(0.35, 0.9)
        s, dm = [], []
        start = rng.randint(0, 4) if rng.rand() < 0.4 else 0
        end = len(query) - (rng.randint(0, 4) if rng.rand() < 0.4 else 0)
        for i, q in enumerate(query):
            if i < start or i >= end or rng.rand() < 0.06:
                s.append('-')
            elif rng.rand() < identity:
                s.append(q)
            else:
                s.append(aas[rng.randint(20)])
            dm.append(int(rng.randint(1, 6)) if rng.rand() < 0.05 else 0)
        seqs.append(''.join(s))
        dels.append(dm)
        descs.append(f'UniRef100_S{r:05d} synthetic homolog n=1 Tax=Synthetic TaxID={1000 + r}')
    return parsers.Msa(sequences=seqs, deletion_matrix=dels, descriptions=descs)


def label_features(chain, feats0):
    """The supervised features of DeepMind's training batch, from the chain's atom37 truth."""
    aatype = chain['aatype']
    pos, mask = chain['all_atom_positions'], chain['all_atom_mask']
    atom14 = {k: feats0[k] for k in ('residx_atom14_to_atom37', 'atom14_atom_exists')}
    out = dict(all_atom_positions=pos, all_atom_mask=mask)
    gt_pos = all_atom.atom37_to_atom14(jnp.asarray(pos), atom14)
    gt_exists = all_atom.atom37_to_atom14(jnp.asarray(mask), atom14)
    # all_atom.get_alt_atom14's renaming (it multiplies an r3.Vecs namedtuple, so it cannot be called as it is):
    # alt[n, j] = sum_i x[n, i] * RENAMING_MATRICES[aatype[n], i, j]
    ren = all_atom.RENAMING_MATRICES[aatype]
    gt_pos, gt_exists = np.asarray(gt_pos), np.asarray(gt_exists)
    alt_pos = np.einsum('nic,nij->njc', gt_pos, ren)
    alt_exists = np.einsum('ni,nij->nj', gt_exists, ren)
    ambiguous = np.zeros((21, 14), np.float32)
    for resname, swap in rc.residue_atom_renaming_swaps.items():
        names = rc.restype_name_to_atom14_names[resname]
        for a, b in swap.items():
            ambiguous[rc.restype_order[rc.restype_3to1[resname]], [names.index(a), names.index(b)]] = 1.
    out.update(atom14_gt_positions=gt_pos, atom14_gt_exists=gt_exists,
               atom14_alt_gt_positions=alt_pos * alt_exists[..., None],
               atom14_alt_gt_exists=alt_exists, atom14_atom_is_ambiguous=ambiguous[aatype])
    frames = all_atom.atom37_to_frames(jnp.asarray(aatype), jnp.asarray(pos), jnp.asarray(mask))
    out.update(frames)
    bb = r3.rigids_from_tensor_flat12(frames['rigidgroups_gt_frames'][:, 0])
    # QuatAffine(quaternion=None, rotation=...) keeps no quaternion: the quaternion is rot_to_quat's, w >= 0.
    q = quat_affine.rot_to_quat([[bb.rot.xx, bb.rot.xy, bb.rot.xz], [bb.rot.yx, bb.rot.yy, bb.rot.yz],
                                 [bb.rot.zx, bb.rot.zy, bb.rot.zz]])
    q = q * jnp.where(q[:, :1] < 0, -1., 1.)
    out['backbone_affine_tensor'] = jnp.concatenate([q, jnp.stack(list(bb.trans), -1)], -1)
    out['backbone_affine_mask'] = frames['rigidgroups_gt_exists'][:, 0]
    tors = all_atom.atom37_to_torsion_angles(jnp.asarray(aatype)[None], jnp.asarray(pos)[None],
                                             jnp.asarray(mask)[None])
    sc = tors['torsion_angles_sin_cos'][0]
    out['chi_angles'] = jnp.arctan2(sc[:, 3:, 0], sc[:, 3:, 1])
    out['chi_mask'] = tors['torsion_angles_mask'][0, :, 3:]
    pb, pbm = modules.pseudo_beta_fn(jnp.asarray(aatype), jnp.asarray(pos), jnp.asarray(mask))
    out.update(pseudo_beta=pb, pseudo_beta_mask=pbm)
    out['resolution'] = np.float32(2.0)
    return {k: np.asarray(v) for k, v in out.items()}


def make_features(args, cfg, chain):
    rng = np.random.RandomState(args.seed + 11)
    query = ''.join(rc.restypes[a] for a in chain['aatype'])
    raw = pipeline.make_sequence_features(query, 'fastfold_tiny', len(query))
    raw['residue_index'] = chain['residue_index']  # the PDB's numbering, with its jump from -1 to 1
    raw.update(pipeline.make_msa_features([synthetic_msa(query, args.num_raw_msa, rng)]))
    feats = af_features.np_example_to_features(raw, cfg, random_seed=args.seed)
    num_iter = args.num_recycle + 1
    labels = label_features(chain, {k: v[0] for k, v in feats.items()})
    labels['use_clamped_fape'] = np.float32(args.use_clamped_fape)
    for k, v in labels.items():
        feats[k] = np.broadcast_to(v, (num_iter,) + np.shape(v)).copy()
    out = {}
    for k, v in feats.items():
        v = np.asarray(v)
        out[k] = v.astype(np.int32) if np.issubdtype(v.dtype, np.integer) or v.dtype == bool else v.astype(np.float32)
    return out


# ----------------------------------------------------------------------------------------------------- params
def flatten_params(params):
    return {f'{scope}//{name}': np.asarray(a) for scope, d in params.items() for name, a in d.items()}


def add_noise(params, seed):
    """Every element moves off haiku's initial value: N(0, (0.1 std)^2), or N(0, 0.1^2) for a constant."""
    rng = np.random.RandomState(seed)
    flat = flatten_params(params)
    out = {}
    for k in sorted(flat):
        a = flat[k].astype(np.float32)
        sd = float(a.std())
        scale = 0.1 * sd if sd > 1e-6 else 0.1
        b = (a + scale * rng.standard_normal(a.shape)).astype(np.float32)
        while np.any((b == 0) | (b == 1)):
            bad = (b == 0) | (b == 1)
            b[bad] += np.float32(1e-3)
        out[k] = b
    return out


def sub_params(params, parent, top, block=None):
    """{scope: {name: arr}} under parent/top, renamed relative to parent; block slices the stacked axis."""
    pre = parent + '/'
    out = {}
    for scope, d in params.items():
        if scope == pre + top or scope.startswith(pre + top + '/'):
            out[scope[len(pre):]] = {n: (a[block] if block is not None else a) for n, a in d.items()}
    if not out:
        raise KeyError(f'no parameters under {pre + top}')
    return out


def full_keys(rel_grads, parent):
    return {f'{parent}/{scope}//{name}': np.asarray(a) for scope, d in rel_grads.items() for name, a in d.items()}


# ------------------------------------------------------------------------------------------------------ tests
class Recorder:
    def __init__(self):
        self.arrays = {}
        self.timings = {}

    def put(self, key, value):
        a = np.asarray(value)
        if a.dtype == np.float64:
            a = a.astype(np.float32)
        if a.dtype == np.int64 or a.dtype == bool:
            a = a.astype(np.int32)
        assert key not in self.arrays, key
        assert np.all(np.isfinite(a)), f'{key} is not finite'
        self.arrays[key] = a


def timed(rec, stage, fn, *a):
    t = time.perf_counter()
    out = jax.block_until_ready(fn(*a))
    rec.timings[stage] = round(time.perf_counter() - t, 2)
    print(f'  {stage}: {rec.timings[stage]:.1f} s', flush=True)
    return out


def module_test(rec, name, build, params, parent, top, block, inputs, seed, stage=None):
    """Runs build(**inputs) (a haiku module call) on params[parent/top] (block's slice) and its VJP with a random
    cotangent; records T/in, T/out, T/dout, T/grad, T/dparam under name."""
    p = sub_params(params, parent, top, block)
    f = hk.transform(build)
    float_in = {k: v for k, v in inputs.items() if v.dtype == np.float32 and not k.endswith('mask')}
    fixed_in = {k: v for k, v in inputs.items() if k not in float_in}
    key = jax.random.PRNGKey(seed)

    def fwd(p, xin):
        return f.apply(p, key, **xin, **fixed_in)

    out_shape = jax.eval_shape(fwd, p, float_in)
    rng = np.random.RandomState(seed)
    dout = jax.tree_util.tree_map(lambda s: rng.standard_normal(s.shape).astype(np.float32), out_shape)

    @jax.jit
    def run(p, xin, dout):
        out, vjp = jax.vjp(fwd, p, xin)
        dp, dx = vjp(dout)
        return out, dp, dx

    out, dp, dx = timed(rec, stage or name, run, p, float_in, dout)
    for k, v in inputs.items():
        rec.put(f'{name}/in/{k}', v)
    for prefix, tree in (('out', out), ('dout', dout)):
        if isinstance(tree, dict):
            for k, v in tree.items():
                rec.put(f'{name}/{prefix}/{k}', v)
        else:
            rec.put(f'{name}/{prefix}/out', tree)
    for k, v in dx.items():
        rec.put(f'{name}/grad/{k}', v)
    for k, v in full_keys(dp, parent).items():
        rec.put(f'{name}/dparam/{k}', v)
    return out


def evoformer_module_tests(rec, cfg, params, rng):
    gc = cfg.model.global_config
    e = cfg.model.embeddings_and_evoformer
    ev = e.evoformer
    L, S, cm, cz = ARGS.num_res, ARGS.num_msa, e.msa_channel, e.pair_channel
    seq_mask = np.ones(L, np.float32)
    seq_mask[-2:] = 0.  # padded residues
    msa_mask = (rng.rand(S, L) > 0.1).astype(np.float32) * seq_mask[None]
    msa_mask[-1] = 0.  # a padded MSA row
    pair_mask = seq_mask[:, None] * seq_mask[None, :]
    msa = rng.standard_normal((S, L, cm)).astype(np.float32)
    pair = rng.standard_normal((L, L, cz)).astype(np.float32)
    parent = EVO + '/evoformer_iteration'
    M = modules

    tests = [
        ('msa_row_attention_with_pair_bias',
         lambda msa_act, msa_mask, pair_act: M.MSARowAttentionWithPairBias(
             ev.msa_row_attention_with_pair_bias, gc, name='msa_row_attention_with_pair_bias')(
                 msa_act, msa_mask, pair_act=pair_act, is_training=False),
         dict(msa_act=msa, msa_mask=msa_mask, pair_act=pair)),
        ('msa_column_attention',
         lambda msa_act, msa_mask: M.MSAColumnAttention(
             ev.msa_column_attention, gc, name='msa_column_attention')(msa_act, msa_mask, is_training=False),
         dict(msa_act=msa, msa_mask=msa_mask)),
        ('msa_transition',
         lambda msa_act, msa_mask: M.Transition(ev.msa_transition, gc, name='msa_transition')(
             msa_act, msa_mask, is_training=False),
         dict(msa_act=msa, msa_mask=msa_mask)),
        ('outer_product_mean',
         lambda msa_act, msa_mask: M.OuterProductMean(
             ev.outer_product_mean, gc, num_output_channel=cz, name='outer_product_mean')(
                 msa_act, msa_mask, is_training=False),
         dict(msa_act=msa, msa_mask=msa_mask)),
        ('triangle_multiplication_outgoing',
         lambda pair_act, pair_mask: M.TriangleMultiplication(
             ev.triangle_multiplication_outgoing, gc, name='triangle_multiplication_outgoing')(
                 pair_act, pair_mask, is_training=False),
         dict(pair_act=pair, pair_mask=pair_mask)),
        ('triangle_multiplication_incoming',
         lambda pair_act, pair_mask: M.TriangleMultiplication(
             ev.triangle_multiplication_incoming, gc, name='triangle_multiplication_incoming')(
                 pair_act, pair_mask, is_training=False),
         dict(pair_act=pair, pair_mask=pair_mask)),
        ('triangle_attention_starting_node',
         lambda pair_act, pair_mask: M.TriangleAttention(
             ev.triangle_attention_starting_node, gc, name='triangle_attention_starting_node')(
                 pair_act, pair_mask, is_training=False),
         dict(pair_act=pair, pair_mask=pair_mask)),
        ('triangle_attention_ending_node',
         lambda pair_act, pair_mask: M.TriangleAttention(
             ev.triangle_attention_ending_node, gc, name='triangle_attention_ending_node')(
                 pair_act, pair_mask, is_training=False),
         dict(pair_act=pair, pair_mask=pair_mask)),
        ('pair_transition',
         lambda pair_act, pair_mask: M.Transition(ev.pair_transition, gc, name='pair_transition')(
             pair_act, pair_mask, is_training=False),
         dict(pair_act=pair, pair_mask=pair_mask)),
    ]
    for i, (name, build, inputs) in enumerate(tests):
        module_test(rec, name, build, params, parent, name, 0, inputs, seed=100 + i, stage=f'module {name}')

    # The extra MSA stack's column attention is global (Suppl. Alg. 19): its block 0, on extra-MSA-sized inputs.
    Se, ce = ARGS.num_extra_msa, e.extra_msa_channel
    emask = (rng.rand(Se, L) > 0.1).astype(np.float32) * seq_mask[None]
    module_test(rec, 'msa_column_global_attention',
                lambda msa_act, msa_mask: M.MSAColumnGlobalAttention(
                    ev.msa_column_attention, gc, name='msa_column_global_attention')(
                        msa_act, msa_mask, is_training=False),
                params, EVO + '/extra_msa_stack', 'msa_column_global_attention', 0,
                dict(msa_act=rng.standard_normal((Se, L, ce)).astype(np.float32), msa_mask=emask),
                seed=120, stage='module msa_column_global_attention')
    return dict(seq_mask=seq_mask, msa_mask=msa_mask, pair_mask=pair_mask, msa=msa, pair=pair, emask=emask)


def evoformer_iteration_tests(rec, cfg, params, rng, m):
    gc = cfg.model.global_config
    e = cfg.model.embeddings_and_evoformer
    L = ARGS.num_res

    def build(extra):
        name = 'extra_msa_stack' if extra else 'evoformer_iteration'

        def f(msa, pair, msa_mask, pair_mask):
            return modules.EvoformerIteration(e.evoformer, gc, is_extra_msa=extra, name=name)(
                {'msa': msa, 'pair': pair}, {'msa': msa_mask, 'pair': pair_mask}, is_training=False,
                safe_key=prng.SafeKey(jax.random.PRNGKey(0)))
        return name, f

    name, f = build(False)
    module_test(rec, name, f, params, EVO, name, 0,
                dict(msa=m['msa'], pair=m['pair'], msa_mask=m['msa_mask'], pair_mask=m['pair_mask']),
                seed=200, stage='evoformer_iteration')
    name, f = build(True)
    Se, ce = ARGS.num_extra_msa, e.extra_msa_channel
    module_test(rec, name, f, params, EVO, name, 0,
                dict(msa=rng.standard_normal((Se, L, ce)).astype(np.float32), pair=m['pair'],
                     msa_mask=m['emask'], pair_mask=m['pair_mask']),
                seed=201, stage='extra_msa_stack iteration')


def random_affine(rng, n, spread):
    q = rng.standard_normal((n, 4)).astype(np.float32)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    q *= np.sign(q[:, :1])
    t = (spread * rng.standard_normal((n, 3))).astype(np.float32)
    return np.concatenate([q, t], -1).astype(np.float32)


def structure_tests(rec, cfg, params, rng, feats):
    gc = cfg.model.global_config
    sm = cfg.model.heads.structure_module
    e = cfg.model.embeddings_and_evoformer
    L = ARGS.num_res
    parent_it = 'alphafold/alphafold_iteration'

    # Invariant point attention (the fold iteration's), alone.
    ipa_mask = np.ones((L, 1), np.float32)
    ipa_mask[-1] = 0.
    module_test(rec, 'invariant_point_attention',
                lambda inputs_1d, inputs_2d, affine, mask: folding.InvariantPointAttention(sm, gc)(
                    inputs_1d=inputs_1d, inputs_2d=inputs_2d, mask=mask,
                    affine=quat_affine.QuatAffine.from_tensor(affine)),
                params, parent_it + '/structure_module/fold_iteration', 'invariant_point_attention', None,
                dict(inputs_1d=rng.standard_normal((L, sm.num_channel)).astype(np.float32),
                     inputs_2d=rng.standard_normal((L, L, e.pair_channel)).astype(np.float32),
                     affine=random_affine(rng, L, 3.0), mask=ipa_mask),
                seed=300, stage='invariant_point_attention')

    # The structure module on random single/pair representations, with its losses against the chain's truth.
    batch = {k: v[0] for k, v in feats.items()}
    keep = ('aatype', 'seq_mask', 'residue_index', 'atom14_atom_exists', 'residx_atom14_to_atom37',
            'residx_atom37_to_atom14', 'atom37_atom_exists', 'all_atom_positions', 'all_atom_mask',
            'atom14_gt_positions', 'atom14_gt_exists', 'atom14_alt_gt_positions', 'atom14_alt_gt_exists',
            'atom14_atom_is_ambiguous', 'rigidgroups_gt_frames', 'rigidgroups_gt_exists',
            'rigidgroups_alt_gt_frames', 'backbone_affine_tensor', 'backbone_affine_mask', 'chi_angles', 'chi_mask',
            'use_clamped_fape')
    batch = {k: batch[k] for k in keep}
    single = rng.standard_normal((L, e.seq_channel)).astype(np.float32)
    pair = rng.standard_normal((L, L, e.pair_channel)).astype(np.float32)

    def fwd(single, pair):
        mod = folding.StructureModule(sm, gc, compute_loss=True)
        value = mod({'single': single, 'pair': pair}, batch, is_training=False)
        loss = mod.loss(value, batch)
        return loss['loss'], (value, loss)

    f = hk.transform(fwd)
    p = sub_params(params, parent_it, 'structure_module')
    key = jax.random.PRNGKey(301)

    @jax.jit
    def run(p, single, pair):
        def lf(p, single, pair):
            return f.apply(p, key, single, pair)
        (loss, aux), grads = jax.value_and_grad(lf, argnums=(0, 1, 2), has_aux=True)(p, single, pair)
        return loss, structure_outputs(aux[0]), loss_terms(aux[1]), grads

    loss, outs, terms, (dp, ds, dz) = timed(rec, 'structure_module + loss + grad', run, p, single, pair)
    T = 'structure_module'
    rec.put(f'{T}/in/single', single)
    rec.put(f'{T}/in/pair', pair)
    for k, v in batch.items():
        rec.put(f'{T}/in/{k}', v)
    for k, v in outs.items():
        rec.put(f'{T}/out/{k}', v)
    for k, v in terms.items():
        rec.put(f'{T}/loss/{k}', v)
    rec.put(f'{T}/grad/single', ds)
    rec.put(f'{T}/grad/pair', dz)
    for k, v in full_keys(dp, parent_it).items():
        rec.put(f'{T}/dparam/{k}', v)


def structure_outputs(value):
    """The structure module's outputs as plain arrays: rigids as flat12 [.., 12] (rotation row-major, then
    translation), vectors as [.., 3]."""
    sc = value['sidechains']
    out = {
        'traj': value['traj'],  # [num_layer, L, 7] quaternion (w, x, y, z) + translation in Angstrom
        'sidechains/frames': r3.rigids_to_tensor_flat12(sc['frames']),  # [num_layer, L, 8, 12]
        'sidechains/atom_pos': r3.vecs_to_tensor(sc['atom_pos']),  # [num_layer, L, 14, 3]
        'sidechains/angles_sin_cos': sc['angles_sin_cos'],  # [num_layer, L, 7, 2]
        'sidechains/unnormalized_angles_sin_cos': sc['unnormalized_angles_sin_cos'],
        'final_atom14_positions': value['final_atom14_positions'],
        'final_atom_positions': value['final_atom_positions'],
        'final_affines': value['final_affines'],
    }
    if 'representations' in value:  # AlphaFoldIteration moves it to ret['representations']['structure_module']
        out['act'] = value['representations']['structure_module']
    for k in ('alt_naming_is_better', 'renamed_atom14_gt_positions', 'renamed_atom14_gt_exists'):
        if k in value:
            out[k] = value[k]
    if 'violations' in value:
        for group, d in value['violations'].items():
            if isinstance(d, dict):
                for k, v in d.items():
                    out[f'violations/{group}/{k}'] = v
            else:
                out[f'violations/{group}'] = d
    return out


def loss_terms(ret):
    out = {}
    for k, v in ret.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                out[f'{k}/{k2}'] = v2
        else:
            out[k] = v
    return out


# --------------------------------------------------------------------------------------------------- the model
PER_ITER_PREV = ('prev_msa_first_row', 'prev_pair', 'prev_pos')


class RecycledAlphaFold(hk.Module):
    """DeepMind's AlphaFold.__call__ at training time, unrolled: iteration i reads the features' slice i
    (resample_msa_in_recycling), prev starts at zeros of the model's sizes, stop_gradient between iterations, the
    loss on the last iteration only."""

    def __init__(self, config, name='alphafold'):
        super().__init__(name=name)
        self.config = config

    def __call__(self, batch, num_iter, is_training=True):
        impl = modules.AlphaFoldIteration(self.config, self.config.global_config)
        e = self.config.embeddings_and_evoformer
        L = batch['aatype'].shape[1]
        prev = {'prev_pos': jnp.zeros([L, rc.atom_type_num, 3]),
                'prev_msa_first_row': jnp.zeros([L, e.msa_channel]),
                'prev_pair': jnp.zeros([L, L, e.pair_channel])}
        history = []
        for i in range(num_iter):
            last = i == num_iter - 1
            ens = {k: v[i:i + 1] for k, v in batch.items()}
            res = impl(ensembled_batch=ens, non_ensembled_batch=prev, is_training=is_training,
                       compute_loss=last, ensemble_representations=False)
            ret, total = res if last else (res, None)
            prev = jax.tree_util.tree_map(jax.lax.stop_gradient, {
                'prev_pos': ret['structure_module']['final_atom_positions'],
                'prev_msa_first_row': ret['representations']['msa_first_row'],
                'prev_pair': ret['representations']['pair']})
            history.append(prev)
        return total, ret, history


def model_outputs(ret, history):
    out = {}
    for i, h in enumerate(history):
        for k, v in h.items():
            out[f'iter{i}/{k}'] = v
    for k, v in ret['representations'].items():
        out[f'out/representations/{k}'] = v
    out['out/distogram/logits'] = ret['distogram']['logits']
    out['out/distogram/bin_edges'] = ret['distogram']['bin_edges']
    out['out/masked_msa/logits'] = ret['masked_msa']['logits']
    out['out/predicted_lddt/logits'] = ret['predicted_lddt']['logits']
    if 'experimentally_resolved' in ret:
        out['out/experimentally_resolved/logits'] = ret['experimentally_resolved']['logits']
    for k, v in structure_outputs(ret['structure_module']).items():
        out[f'out/structure_module/{k}'] = v
    losses = {}
    for head in ('distogram', 'masked_msa', 'predicted_lddt', 'experimentally_resolved'):
        if head in ret and 'loss' in ret[head]:
            losses[f'loss/{head}'] = ret[head]['loss']
    sm = ret['structure_module']
    for k in ('loss', 'fape', 'sidechain_fape', 'chi_loss', 'angle_norm_loss'):
        if k in sm:
            losses[f'loss/structure_module/{k}'] = sm[k]
    for k, v in sm.get('metrics', {}).items():
        losses[f'loss/structure_module/metrics/{k}'] = v
    if 'true_dist' in ret['distogram']:
        out['out/distogram/true_dist'] = ret['distogram']['true_dist']
    out.update(losses)
    return out


# ------------------------------------------------------------------------------------------------------- main
def script_hash():
    with open(os.path.abspath(__file__), 'rb') as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def main():
    args = ARGS
    out_dir = os.path.abspath(args.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    stamp = {'script_sha256': script_hash(),
             'args': {k: v for k, v in vars(args).items() if k not in ('out_dir', 'cache', 'force')},
             'versions': {'jax': jax.__version__, 'haiku': hk.__version__, 'numpy': np.__version__}}
    manifest_path = os.path.join(out_dir, 'manifest.json')
    if not args.force and os.path.exists(manifest_path):
        with open(manifest_path) as fh:
            old = json.load(fh)
        if all(old.get(k) == v for k, v in stamp.items()):
            print(f'{out_dir}: up to date')
            return 0
    if os.path.exists(manifest_path):
        os.remove(manifest_path)

    os.makedirs(args.cache, exist_ok=True)
    jax.config.update('jax_compilation_cache_dir', os.path.abspath(args.cache))
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
    jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)

    t_all = time.perf_counter()
    cfg = tiny_config(args)
    rec_model, rec_mod, rec_evo, rec_str = Recorder(), Recorder(), Recorder(), Recorder()
    timings = {}

    print('features', flush=True)
    t = time.perf_counter()
    chain = load_chain(args)
    feats = make_features(args, cfg, chain)
    timings['features'] = round(time.perf_counter() - t, 2)
    print(f'  features: {timings["features"]:.1f} s', flush=True)

    # Parameters: haiku's initial values (zero_init=False) plus noise, written as DeepMind's npz, read back as
    # DeepMind reads it.
    print('parameters', flush=True)
    num_iter = args.num_recycle + 1
    f = hk.transform(lambda batch: RecycledAlphaFold(cfg.model)(batch, num_iter))
    init_f = hk.transform(lambda batch: RecycledAlphaFold(cfg.model)(batch, 1))
    key = jax.random.PRNGKey(args.seed)
    t = time.perf_counter()
    params0 = jax.block_until_ready(jax.jit(init_f.init)(key, {k: v[:1] for k, v in feats.items()}))
    timings['init params'] = round(time.perf_counter() - t, 2)
    print(f'  init params: {timings["init params"]:.1f} s', flush=True)
    flat = add_noise(params0, args.seed + 1)
    os.makedirs(os.path.join(out_dir, 'params'), exist_ok=True)
    params_path = os.path.join(out_dir, 'params', f'params_{PARAMS_NAME}.npz')
    np.savez(params_path, **flat)
    params = af_data.get_model_haiku_params(PARAMS_NAME, out_dir, fuse=False, to_jnp=False)
    assert set(flatten_params(params)) == set(flat), 'the npz does not read back as the same parameters'
    params = {s: {n: np.asarray(a) for n, a in d.items()} for s, d in params.items()}

    # ColabFold's own reading (fuse=True) runs its fused triangle multiplication: it must agree with the unfused
    # module on the same weights, else the npz's left/right halves are swapped.
    fused_check = check_fused(cfg, out_dir)

    rng = np.random.RandomState(args.seed + 2)
    if not args.model_only:
        print('evoformer modules', flush=True)
        m = evoformer_module_tests(rec_mod, cfg, params, rng)
        print('evoformer iterations', flush=True)
        evoformer_iteration_tests(rec_evo, cfg, params, rng, m)
        print('structure', flush=True)
        structure_tests(rec_str, cfg, params, rng, feats)

    print('model', flush=True)

    @jax.jit
    def run_model(params, batch):
        def lf(params):
            total, ret, history = f.apply(params, key, batch)
            return total, model_outputs(ret, history)
        (total, outs), grads = jax.value_and_grad(lf, has_aux=True)(params)
        return total, outs, grads

    total, outs, grads = timed(rec_model, f'model ({num_iter} iterations) + loss + grad', run_model, params, feats)
    for k, v in feats.items():
        rec_model.put(f'feat/{k}', v)
    for k, v in outs.items():
        rec_model.put(k, v)
    rec_model.put('loss/total', total)
    rec_model.put('out/plddt', confidence.compute_plddt(np.asarray(outs['out/predicted_lddt/logits'])))
    grads_flat = flatten_params(grads)
    assert set(grads_flat) == set(flat)
    for k, v in grads_flat.items():
        assert np.all(np.isfinite(v)), k

    files = {'model.npz': rec_model.arrays, 'grads.npz': grads_flat}
    if not args.model_only:
        files.update({'modules.npz': rec_mod.arrays, 'evoformer.npz': rec_evo.arrays, 'structure.npz': rec_str.arrays})
    for name, arrays in files.items():
        np.savez(os.path.join(out_dir, name), **arrays)
    for r in (rec_mod, rec_evo, rec_str, rec_model):
        timings.update(r.timings)
    timings['total'] = round(time.perf_counter() - t_all, 2)

    heads = cfg.model.heads
    conf = {
        'params_npz': f'params/params_{PARAMS_NAME}.npz',
        'sizes': {'num_res': args.num_res, 'num_msa': args.num_msa, 'num_extra_msa': args.num_extra_msa,
                  'num_iter': num_iter},
        'loss_weights': {h: float(heads[h].weight) for h in heads},
        'structural_violation_loss_weight': float(heads.structure_module.structural_violation_loss_weight),
        'fused_triangle_multiplication_max_abs_diff': fused_check,
        'outer_product_mean': "DeepMind's association (ColabFold's OPM_REASSOCIATE_ROWS set to 0)",
        'chain': {'pdb': args.pdb, 'crop_start': args.crop_start,
                  'sequence': ''.join(rc.restypes[a] for a in chain['aatype'])},
        'model_config': cfg.model.to_dict(),
        'data_config': json.loads(cfg.data.to_json_best_effort()),
    }
    with open(os.path.join(out_dir, 'config.json'), 'w') as fh:
        json.dump(conf, fh, indent=1, default=str)
    with open(os.path.join(out_dir, 'timings.json'), 'w') as fh:
        json.dump(timings, fh, indent=1)
    files['params/params_model_tiny.npz'] = flat
    manifest = dict(stamp)
    manifest['files'] = {name: {k: [list(v.shape), str(v.dtype)] for k, v in sorted(arrays.items())}
                         for name, arrays in files.items()}
    with open(manifest_path, 'w') as fh:
        json.dump(manifest, fh, indent=1)
    print(f'total loss {float(total):.6f}; {timings["total"]:.1f} s; wrote {out_dir}', flush=True)
    return 0


def check_fused(cfg, out_dir):
    """Max |fused - unfused| of both triangle multiplications (block 0) on random input."""
    gc = cfg.model.global_config
    ev = cfg.model.embeddings_and_evoformer.evoformer
    unfused = af_data.get_model_haiku_params(PARAMS_NAME, out_dir, fuse=False, to_jnp=False)
    fused = af_data.get_model_haiku_params(PARAMS_NAME, out_dir, fuse=True, to_jnp=False)
    rng = np.random.RandomState(7)
    L, cz = ARGS.num_res, cfg.model.embeddings_and_evoformer.pair_channel
    x = rng.standard_normal((L, L, cz)).astype(np.float32)
    mask = np.ones((L, L), np.float32)
    worst = 0.
    for name in ('triangle_multiplication_outgoing', 'triangle_multiplication_incoming'):
        outs = []
        for params, fuse in ((unfused, False), (fused, True)):
            c = ev[name].copy_and_resolve_references()
            with c.unlocked():
                c.fuse_projection_weights = fuse
            f = hk.transform(lambda a, m: modules.TriangleMultiplication(c, gc, name=name)(a, m, is_training=False))
            p = sub_params(params, EVO + '/evoformer_iteration', name, 0)
            outs.append(np.asarray(jax.jit(f.apply)(p, None, x, mask)))
        worst = max(worst, float(np.abs(outs[0] - outs[1]).max()))
    print(f'  fused vs unfused triangle multiplication: max |diff| {worst:.3g}', flush=True)
    assert worst < 1e-4, worst
    return worst


if __name__ == '__main__':
    sys.exit(main())
