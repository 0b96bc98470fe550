"""AlphaFold 2.3's structure module and its losses in float64 (JAX's x64), on the inputs and parameters of the
float32 golden files alphafold_reference.py wrote: the reference for gradients whose float32 values carry
AlphaFold's own rounding. Its float32 gradients through the backbone frames differ from this float64 run by
up to 8e-5 of their largest entry (the side-chain path's by 1e-6), so Kuafu's float32 is held to 1e-4 there
and Kuafu's float64 to this file.

Run with alphafold_reference.py's venv, after it:
    AFVENV/bin/python alphafold_reference_float64.py tests/apps/fastfold/golden/alphafold_tiny
Writes OUT_DIR/structure_float64.npz: structure_module/loss/<term>, structure_module/grad/{single,pair},
structure_module/dparam/<params_model_tiny.npz key>; and OUT_DIR/model_float64.npz: the whole model with
recycling on model.npz's batch, loss/total and d(loss/total)/d(parameter) keyed as params_model_tiny.npz;
and OUT_DIR/lddt.npz: alphafold.model.lddt of the golden prediction's Cα against the truth's, per residue
and whole, with the truth's Cα mask and with every other residue left out.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import alphafold_reference as reference  # noqa: E402  (sets up JAX single-threaded on the CPU)

import haiku as hk  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from alphafold.model import data as af_data, folding, utils as af_utils  # noqa: E402

jax.config.update('jax_enable_x64', True)
# The embeddings cast to utils.half_dtype, float32 whenever bfloat16 is off: float64 here.
af_utils.half_dtype = lambda global_config: jnp.float64


def main(golden_dir):
    cfg = reference.tiny_config(reference.parse_args([golden_dir, '--cache', os.path.join(golden_dir, 'unused')]))
    params = af_data.get_model_haiku_params(reference.PARAMS_NAME, golden_dir, fuse=False, to_jnp=False)
    params = {s: {n: np.asarray(a, np.float64) for n, a in d.items()} for s, d in params.items()}
    golden = dict(np.load(os.path.join(golden_dir, 'structure.npz')))
    test = 'structure_module/'
    batch = {k[len(test + 'in/'):]: v.astype(np.float64) if v.dtype == np.float32 else v
             for k, v in golden.items() if k.startswith(test + 'in/')}
    single, pair = batch.pop('single'), batch.pop('pair')
    sm, gc = cfg.model.heads.structure_module, cfg.model.global_config

    def fwd(single, pair):
        module = folding.StructureModule(sm, gc, compute_loss=True)
        value = module({'single': single, 'pair': pair}, batch, is_training=False)
        loss = module.loss(value, batch)
        return loss['loss'], reference.loss_terms(loss)

    f = hk.transform(fwd)
    parent = 'alphafold/alphafold_iteration'
    p = reference.sub_params(params, parent, 'structure_module')
    run = jax.jit(jax.value_and_grad(lambda p, s, z: f.apply(p, jax.random.PRNGKey(301), s, z), argnums=(0, 1, 2),
                                     has_aux=True))
    (_, terms), (dp, ds, dz) = run(p, single, pair)
    out = {f'{test}loss/{k}': np.asarray(v) for k, v in terms.items()}
    out[f'{test}grad/single'] = np.asarray(ds)
    out[f'{test}grad/pair'] = np.asarray(dz)
    for k, v in reference.full_keys(dp, parent).items():
        out[f'{test}dparam/{k}'] = np.asarray(v)
    assert all(v.dtype == np.float64 for k, v in out.items() if '/loss/metrics/' not in k), 'not all float64'
    np.savez(os.path.join(golden_dir, 'structure_float64.npz'), **out)

    # The whole model, recycled as alphafold_reference.py recycles it, on the float32 run's batch.
    feats = {k[len('feat/'):]: v.astype(np.float64) if v.dtype == np.float32 else v
             for k, v in np.load(os.path.join(golden_dir, 'model.npz')).items() if k.startswith('feat/')}
    num_iter = feats['aatype'].shape[0]
    model = hk.transform(lambda batch: reference.RecycledAlphaFold(cfg.model)(batch, num_iter)[0])
    total, grads = jax.jit(jax.value_and_grad(lambda p, b: model.apply(p, jax.random.PRNGKey(args_seed(golden_dir)), b)))(
        params, feats)
    out = {'loss/total': np.asarray(total)}
    out.update(reference.flatten_params(grads))
    assert all(v.dtype == np.float64 for v in out.values()), 'not all float64'
    np.savez(os.path.join(golden_dir, 'model_float64.npz'), **out)


def lddt_reference(golden_dir):
    from alphafold.model import lddt
    model = np.load(os.path.join(golden_dir, 'model.npz'))
    predicted = model['out/structure_module/final_atom_positions'][None, :, 1].astype(np.float64)
    truth = model['feat/all_atom_positions'][-1][None, :, 1].astype(np.float64)
    mask = model['feat/all_atom_mask'][-1][None, :, 1:2].astype(np.float64)
    sparse = mask.copy()
    sparse[:, ::2] = 0
    out = {}
    for name, m in (('mask', mask), ('sparse', sparse)):
        out[f'{name}/per_residue'] = np.asarray(lddt.lddt(predicted, truth, m, per_residue=True))
        out[f'{name}/whole'] = np.asarray(lddt.lddt(predicted, truth, m, per_residue=False))
        out[f'{name}/mask'] = m
    out['predicted'], out['truth'] = predicted, truth
    np.savez(os.path.join(golden_dir, 'lddt.npz'), **out)


def args_seed(golden_dir):
    """The seed alphafold_reference.py ran with (its PRNG key reaches no random op: deterministic=True)."""
    import json
    with open(os.path.join(golden_dir, 'manifest.json')) as f:
        return json.load(f)['args']['seed']


if __name__ == '__main__':
    lddt_reference(sys.argv[1])
    main(sys.argv[1])
