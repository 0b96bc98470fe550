"""The CPU's float32 products on LibTorch's MKL against Debian's OpenBLAS (OpenMP build), the choice
runtime.cpu_blas makes for Kuafu (core/ops/cpu_blas.h): GFLOP/s of GPT-2 124M's products at 1 x 1024
tokens (each linear layer's forward, dx and dW; the output layer's 50,257 rows) and the time of one
causal flash-attention layer forward and backward, in the venv's torch. OpenBLAS is put in front of
LibTorch's MKL the way Kuafu does it, by the dynamic linker (here LD_PRELOAD of the library), in a child
process; rounds alternate so that drift touches both alike. One JSON line per library and round.

usage: .venv/bin/python benchmarks/cpu_blas.py [ROUNDS=3] [THREADS=2]
"""
import json
import os
import statistics
import subprocess
import sys
import time

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0"
TOKENS = 1024
# name: (rows of W, columns of W) for y = x Wᵀ with W [out, in]
LAYERS = {"qkv": (2304, 768), "proj": (768, 768), "fc": (3072, 768), "fc2": (768, 3072), "head": (50257, 768)}


def median_seconds(fn, repeats=5):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(threads):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    rates = {}
    for name, (out, inp) in LAYERS.items():
        x, w, dy = torch.randn(TOKENS, inp), torch.randn(out, inp), torch.randn(TOKENS, out)
        flops = 2.0 * TOKENS * inp * out
        for part, fn in (("forward", lambda: torch.mm(x, w.t())), ("dx", lambda: torch.mm(dy, w)),
                         ("dW", lambda: torch.mm(dy.t(), x))):
            rates[f"{name}_{part}"] = round(flops / median_seconds(fn) / 1e9, 1)
    q, k, v = (torch.randn(1, 12, TOKENS, 64, requires_grad=True) for _ in range(3))
    upstream = torch.randn(1, 12, TOKENS, 64)

    def attention():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(upstream)
    return {"gflops": rates, "attention_layer_ms": round(median_seconds(attention) * 1e3, 2)}


def main():
    if os.environ.get("KUAFU_CPU_BLAS_CHILD"):
        print(json.dumps(measure(int(os.environ["KUAFU_CPU_BLAS_CHILD"]))))
        return
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    for round_index in range(rounds):
        for blas in ("mkl", "openblas"):
            env = dict(os.environ, KUAFU_CPU_BLAS_CHILD=str(threads))
            if blas == "openblas":
                env["LD_PRELOAD"] = OPENBLAS
            out = subprocess.run([sys.executable, __file__], env=env, check=True, capture_output=True, text=True).stdout
            print(json.dumps({"blas": blas, "round": round_index, "threads": threads} | json.loads(out.splitlines()[-1])),
                  flush=True)


if __name__ == "__main__":
    main()
