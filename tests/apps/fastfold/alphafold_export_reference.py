"""DeepMind's AlphaFold 2.3 running the parameter file Kuafu exported: the reference for "what kuafu-fold export
writes loads back in AlphaFold with the same outputs" (issue 52).

kuafu_export_reference.sh makes the export (kuafu-fold trains the golden tiny model's sizes from its own initial
values, then `kuafu-fold export`) and runs this with alphafold_reference.py's venv, after that script:
    AFVENV/bin/python alphafold_export_reference.py GOLDEN_DIR EXPORT_DIR

Reads EXPORT_DIR/params_model_kuafu.npz through DeepMind's own loader (get_model_haiku_params, fuse=False) after
checking that it holds exactly the parameters, names and shapes, AlphaFold's tiny model makes
(alphafold_reference.py's config; kuafu_fold_model.json's sizes must be those), and runs the whole model with
recycling on GOLDEN_DIR/model.npz's batch as alphafold_reference.py runs it. Writes GOLDEN_DIR/kuafu_export/:
    params/params_model_kuafu.npz, kuafu_fold_model.json   the export, as read
    model.npz   iter<i>/prev_{pos,msa_first_row,pair}, out/representations/*, out/distogram/logits,
                out/masked_msa/logits, out/predicted_lddt/logits, out/structure_module/final_atom_positions,
                loss/total (float32)
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import alphafold_reference as reference  # noqa: E402  (sets up JAX single-threaded on the CPU)

import haiku as hk  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from alphafold.model import data as af_data  # noqa: E402

NAME = 'model_kuafu'


def expected_sizes(cfg):
    """kuafu-fold's size keys for alphafold_reference.py's tiny config."""
    e, h = cfg.model.embeddings_and_evoformer, cfg.model.heads
    ev, s = e.evoformer, h.structure_module
    return {'model.msa_channels': e.msa_channel, 'model.pair_channels': e.pair_channel, 'model.single_channels': e.seq_channel,
            'model.extra_msa_channels': e.extra_msa_channel, 'model.evoformer_blocks': e.evoformer_num_block,
            'model.extra_msa_blocks': e.extra_msa_stack_num_block, 'model.msa_heads': ev.msa_row_attention_with_pair_bias.num_head,
            'model.pair_heads': ev.triangle_attention_starting_node.num_head,
            'model.outer_channels': ev.outer_product_mean.num_outer_channel,
            'model.triangle_channels': ev.triangle_multiplication_outgoing.num_intermediate_channel,
            'model.structure_channels': s.num_channel, 'model.structure_layers': s.num_layer, 'model.ipa_heads': s.num_head,
            'model.ipa_scalar_channels': s.num_scalar_qk, 'model.ipa_query_points': s.num_point_qk,
            'model.ipa_value_points': s.num_point_v, 'model.angle_channels': s.sidechain.num_channel,
            'model.plddt_channels': h.predicted_lddt.num_channels}


def main(golden_dir, export_dir):
    golden_dir = os.path.abspath(golden_dir)
    cfg = reference.tiny_config(reference.parse_args([golden_dir, '--cache', os.path.join(golden_dir, 'unused')]))
    with open(os.path.join(export_dir, 'kuafu_fold_model.json')) as fh:
        sizes = json.load(fh)
    want = expected_sizes(cfg)
    assert sizes == want, f'the export is not the golden tiny model: {sizes} != {want}'

    out_dir = os.path.join(golden_dir, 'kuafu_export')
    os.makedirs(os.path.join(out_dir, 'params'), exist_ok=True)
    shutil.copyfile(os.path.join(export_dir, 'params_model_kuafu.npz'), os.path.join(out_dir, 'params', f'params_{NAME}.npz'))
    shutil.copyfile(os.path.join(export_dir, 'kuafu_fold_model.json'), os.path.join(out_dir, 'kuafu_fold_model.json'))

    feats = {k[len('feat/'):]: v for k, v in np.load(os.path.join(golden_dir, 'model.npz')).items() if k.startswith('feat/')}
    num_iter = feats['aatype'].shape[0]
    model = hk.transform(lambda batch: reference.RecycledAlphaFold(cfg.model)(batch, num_iter))
    key = jax.random.PRNGKey(0)  # reaches no random op: deterministic=True

    # The export holds AlphaFold's parameters, no more and no fewer, at AlphaFold's shapes.
    made = {f'{scope}//{name}': a for scope, d in jax.eval_shape(model.init, key, feats).items() for name, a in d.items()}
    params = af_data.get_model_haiku_params(NAME, out_dir, fuse=False, to_jnp=False)
    read = reference.flatten_params(params)
    assert set(read) == set(made), f'missing {sorted(set(made) - set(read))[:5]}, extra {sorted(set(read) - set(made))[:5]}'
    for k, v in read.items():
        assert v.shape == made[k].shape and v.dtype == np.float32, f'{k}: {v.shape} {v.dtype}, AlphaFold makes {made[k].shape}'

    @jax.jit
    def run(params, batch):
        total, ret, history = model.apply(params, key, batch)
        return total, reference.model_outputs(ret, history)

    total, outs = run(params, feats)
    rec = reference.Recorder()
    for k, v in outs.items():
        if k.startswith(('iter', 'out/representations/', 'loss/')) or k in (
                'out/distogram/logits', 'out/masked_msa/logits', 'out/predicted_lddt/logits',
                'out/structure_module/final_atom_positions'):
            rec.put(k, v)
    rec.put('loss/total', total)
    np.savez(os.path.join(out_dir, 'model.npz'), **rec.arrays)
    print(f'AlphaFold ran Kuafu\'s export: total loss {float(total):.6f}; wrote {out_dir}')


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2])
