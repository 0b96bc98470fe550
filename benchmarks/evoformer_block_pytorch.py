"""OpenFold's own PyTorch Evoformer block (openfold3 0.5.0 from PyPI, torch 2.11.0 on the CPU) timed as
benchmarks/evoformer_block.cpp times Kuafu's and benchmarks/evoformer_block_jax.py times AlphaFold's:
on the CPU or a GPU (--device), in float32 or bfloat16 (--dtype), AlphaFold 2's sizes, S MSA rows, R residues, forward + backward of sum(m) + sum(z) through one
EvoformerBlock (gradients of the parameters, m and z), float32 in eval mode (no dropout), no chunking, the
stock PyTorch attention (no DeepSpeed, cuEquivariance or Triton kernel, no LMA, no in-place inference
path), torch on every core, the median of --steps after --warmup, one JSON line. openfold3's own
requirements pull a CUDA torch, triton, awscli and much more, so its venv takes the project's pinned torch
(as scripts/setup installs it) and, without their dependencies, only what the block's import path needs:

    python3 -m venv /work/ofvenv
    /work/ofvenv/bin/pip install --no-deps torch==2.11.0 nvidia-cufile==1.15.1.6 \
        nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5 filelock==4.2.12 \
        typing_extensions==4.16.0 sympy==1.14.0 mpmath==1.3.0 networkx==3.6.1 Jinja2==3.1.6 \
        MarkupSafe==3.0.4 fsspec==2026.9.0 numpy==2.4.6
    /work/ofvenv/bin/pip install --no-deps openfold3==0.5.0 gemmi==0.7.5 packaging==26.3 \
        ml-collections==1.1.0 absl-py==2.5.1 PyYAML==6.0.4 scipy==1.17.1 biotite==1.6.0

    /work/ofvenv/bin/python benchmarks/evoformer_block_pytorch.py --residues 128 --msa-rows 128

(openfold3 warns on import that Triton is absent and the non-kernel attention runs: that is the path
timed here.)
"""
import argparse
import importlib.metadata
import json
import os
import time

import numpy as np
import torch
from openfold3.core.model.latent.evoformer import EvoformerBlock


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--residues', type=int, default=128)
    p.add_argument('--msa-rows', type=int, default=128)
    p.add_argument('--steps', type=int, default=5)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--forward-only', action='store_true')
    p.add_argument('--device', default='cpu', help='cpu or cuda')
    p.add_argument('--dtype', default='float32', choices=['float32', 'bf16'],
                   help="bf16: the block's weights and inputs in bfloat16 (as Kuafu's benchmark runs it)")
    a = p.parse_args()
    dtype = torch.bfloat16 if a.dtype == 'bf16' else torch.float32
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    # AlphaFold 2's monomer Evoformer (OpenFold's model_1..5 config); dropout rates as there, off in eval()
    block = EvoformerBlock(
        c_m=256, c_z=128, c_hidden_msa_att=32, c_hidden_opm=32, c_hidden_mul=128, c_hidden_pair_att=32,
        no_heads_msa=8, no_heads_pair=4, transition_type='relu', transition_n=4, msa_dropout=0.15,
        pair_dropout=0.25, no_column_attention=False, opm_first=False, fuse_projection_weights=False,
        inf=1e9, eps=1e-8).eval().to(a.device, dtype)
    r, s = a.residues, a.msa_rows
    rng = np.random.RandomState(0)
    m = torch.from_numpy(rng.standard_normal((1, s, r, 256))).to(a.device, dtype).requires_grad_()
    z = torch.from_numpy(rng.standard_normal((1, r, r, 128))).to(a.device, dtype).requires_grad_()
    msa_mask = torch.ones(1, s, r, device=a.device, dtype=dtype)
    pair_mask = torch.ones(1, r, r, device=a.device, dtype=dtype)
    params = list(block.parameters())

    def loss():
        mo, zo = block(m, z, msa_mask=msa_mask, pair_mask=pair_mask, chunk_size=None,
                       use_deepspeed_evo_attention=False, use_cueq_triangle_kernels=False,
                       use_triton_triangle_kernels=False, use_lma=False, inplace_safe=False,
                       _mask_trans=False)  # OpenFold's AF2 config: the transitions ignore the mask, as AF2's
        return mo.sum() + zo.sum()

    def run():
        if a.forward_only:
            with torch.no_grad():
                return loss()
        return torch.autograd.grad(loss(), params + [m, z])

    cuda = a.device.startswith('cuda')
    seconds = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(a.warmup + a.steps):
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        if i >= a.warmup:
            seconds.append(time.perf_counter() - start)
    median = sorted(seconds)[len(seconds) // 2]
    print(json.dumps({'impl': 'openfold_pytorch', 'residues': r, 'msa_rows': s, 'forward_only': a.forward_only,
                      'median_s': median, 'ms_per_residue': 1e3 * median / r, 'steps': seconds,
                      'package': 'openfold3 ' + importlib.metadata.version('openfold3'),
                      'module': 'openfold3.core.model.latent.evoformer.EvoformerBlock',
                      'torch': torch.__version__, 'threads': torch.get_num_threads(), 'device': a.device,
                      'dtype': a.dtype,
                      'peak_device_mb': torch.cuda.max_memory_allocated() / 2**20 if cuda else None}))


if __name__ == '__main__':
    main()
