"""AlphaFold 2.3's own Evoformer block (alphafold-colabfold 2.3.27, JAX on the CPU) timed as
benchmarks/evoformer_block.cpp times Kuafu's: AlphaFold 2's sizes, S MSA rows, R residues, forward +
backward of sum(m) + sum(z) through one EvoformerIteration, jit-compiled once, the median of --steps after
--warmup, one JSON line. Run with alphafold_reference.py's venv (tests/apps/fastfold/alphafold_reference.py).

    AFVENV/bin/python benchmarks/evoformer_block_jax.py --residues 128 --msa-rows 128
"""
import argparse
import json
import os
import time

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from alphafold.model import config as af_config, modules

modules.OPM_REASSOCIATE_ROWS = 0
KEY = jax.random.PRNGKey(0)  # deterministic=True: no random op reads it


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--residues', type=int, default=128)
    p.add_argument('--msa-rows', type=int, default=128)
    p.add_argument('--steps', type=int, default=5)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--forward-only', action='store_true')
    a = p.parse_args()
    cfg = af_config.model_config('model_5')
    g = cfg.model.global_config
    with cfg.unlocked():
        g.bfloat16 = False
        g.deterministic = True
        g.subbatch_size = 4096  # large: no chunking, as Kuafu runs it
        g.use_remat = False
        g.use_pallas = False
        for k in ('triangle_multiplication_outgoing', 'triangle_multiplication_incoming'):
            cfg.model.embeddings_and_evoformer.evoformer[k].fuse_projection_weights = False
    evo = cfg.model.embeddings_and_evoformer.evoformer
    r, s = a.residues, a.msa_rows

    def block(m, z):
        act = {'msa': m, 'pair': z}
        masks = {'msa': jnp.ones((s, r)), 'pair': jnp.ones((r, r))}
        out = modules.EvoformerIteration(evo, g, is_extra_msa=False, name='evoformer_iteration')(
            act, masks, is_training=False, safe_key=None)
        return jnp.sum(out['msa']) + jnp.sum(out['pair'])

    f = hk.transform(block)
    rng = np.random.RandomState(0)
    m = jnp.asarray(rng.standard_normal((s, r, 256)), jnp.float32)
    z = jnp.asarray(rng.standard_normal((r, r, 128)), jnp.float32)
    params = f.init(KEY, m, z)
    run = jax.jit(lambda p, m, z: f.apply(p, KEY, m, z)) if a.forward_only else \
        jax.jit(jax.grad(lambda p, m, z: f.apply(p, KEY, m, z), argnums=(0, 1, 2)))
    seconds = []
    for i in range(a.warmup + a.steps):
        start = time.perf_counter()
        jax.block_until_ready(run(params, m, z))
        if i >= a.warmup:
            seconds.append(time.perf_counter() - start)
    median = sorted(seconds)[len(seconds) // 2]
    print(json.dumps({'impl': 'alphafold_jax', 'residues': r, 'msa_rows': s, 'forward_only': a.forward_only,
                      'median_s': median, 'ms_per_residue': 1e3 * median / r, 'steps': seconds,
                      'xla_flags': os.environ.get('XLA_FLAGS', '')}))


if __name__ == '__main__':
    main()
