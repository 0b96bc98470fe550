"""The same GPT-2 training step as `kuafu-gpt benchmark`, written as an eager PyTorch loop, to compare
per-step time on one machine with the same torch (run it with the checkout's venv: .venv/bin/python).

Same maths as Kuafu's GPT: fused causal attention (scaled_dot_product_attention), tanh GELU, tied head,
AdamW, gradients clipped to norm 1.0 as Kuafu's default optim.grad_clip does (CLIP=0 skips it; nanoGPT
and llm.c clip at 1.0 too). With `bf16` the weights and activations are bfloat16 and AdamW steps float32
master weights that are copied back after each step, as Kuafu's precision.dtype = "bf16" does.

With `compile` the model's forward and backward go through torch.compile (the optimizer step stays
eager), the reference the standing GPU goal names. AdamW is PyTorch's fused one (ADAMW=default: the
per-tensor default on the CPU, foreach on a GPU). With `profile` the eager steps run under
torch.profiler and the line gains "profile": each step's time by kind of work (matrix products,
attention, normalisation, the loss, the optimizer, copies, other), from the GPU's kernels (the CPU's
operators on the CPU), and the 25 largest kernels or operators. SDPA_BACKEND=flash|efficient|cudnn|math
(environment) restricts attention to that backend. On the CPU denormals are flushed to zero
(FLUSH_DENORMAL=0 keeps them), or PyTorch's step slows several-fold after a few steps.

usage: .venv/bin/python benchmarks/gpt_eager_pytorch.py LAYERS HEADS WIDTH VOCAB CONTEXT BATCH
           [STEPS] [THREADS] [fp32|bf16] [cpu|cuda] [eager|compile|profile]
"""
import contextlib
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.c_attn, self.c_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.c_fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, heads, c, vocab, positions):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(positions, c)
        self.h = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


# Kinds of work by kernel (or operator) name, first match wins.
KINDS = [
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "aten::mm", "aten::addmm", "aten::bmm")),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("norm", ("layer_norm", "layernorm", "gammabeta")),
    ("loss", ("softmax", "nll", "cross_entropy", "logsumexp")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("gelu", ("gelu",)),
    ("copy", ("copy", "cast", "to_copy", "clone", "cat")),
]


def kind_of(name):
    lowered = name.lower()
    for kind, keys in KINDS:
        if any(key in lowered for key in keys):
            return kind
    return "other"


def profile_summary(prof, steps):
    """Per-step milliseconds by kind and the largest entries: GPU kernels where there are any, else
    the CPU's operators (self time, so nothing counts twice)."""
    rows = []
    for e in prof.key_averages():
        device_us = getattr(e, "self_device_time_total", 0) or 0
        if device_us > 0 and str(getattr(e, "device_type", "")).endswith("CUDA"):
            rows.append((e.key, device_us))
    source = "cuda kernels" if rows else "cpu operators"
    if not rows:
        rows = [(e.key, e.self_cpu_time_total) for e in prof.key_averages() if e.self_cpu_time_total > 0
                and not e.key.startswith("ProfilerStep")]
    by_kind = {}
    for name, us in rows:
        by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0.0) + us / 1e3 / steps
    top = sorted(rows, key=lambda r: -r[1])[:25]
    return {"source": source,
            "ms_per_step_by_kind": {k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "top": [[name[:100], round(us / 1e3 / steps, 3)] for name, us in top]}


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    layers, heads, c, vocab, context, batch = map(int, sys.argv[1:7])
    steps = int(sys.argv[7]) if len(sys.argv) > 7 else 10
    torch.set_num_threads(int(sys.argv[8]) if len(sys.argv) > 8 else 2)
    dtype = sys.argv[9] if len(sys.argv) > 9 else "fp32"
    assert dtype in ("fp32", "bf16"), f"precision must be fp32 or bf16, not {dtype}"
    device = torch.device(sys.argv[10] if len(sys.argv) > 10 else "cpu")
    mode = sys.argv[11] if len(sys.argv) > 11 else "eager"
    assert mode in ("eager", "compile", "profile"), f"mode must be eager, compile or profile, not {mode}"
    # On the CPU, denormal floats slow PyTorch's step several-fold after a few steps (GPT-2 124M, 1 x 1024:
    # 4.2 s a step with them flushed, 25 s without, measured 2026-11-28); Kuafu's step does not slow so.
    flushed = device.type == "cpu" and os.environ.get("FLUSH_DENORMAL", "1") == "1" and torch.set_flush_denormal(True)
    # PyTorch's fastest AdamW (one kernel over all tensors; on the CPU 61 ms a step for GPT-2 124M against
    # 185 ms for the default per-tensor loop, measured 2026-11-30); ADAMW=default keeps the default.
    fused_adamw = os.environ.get("ADAMW", "fused") == "fused"
    clip = float(os.environ.get("CLIP", "1.0"))  # Kuafu's optim.grad_clip default; 0: no clipping
    torch.manual_seed(0)
    model = GPT(layers, heads, c, vocab, context).to(device)
    if dtype == "bf16":
        masters = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
        model.to(torch.bfloat16)
        opt = torch.optim.AdamW(masters, lr=1e-4, fused=fused_adamw)
    else:
        masters = None
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused_adamw)
    forward = torch.compile(model) if mode == "compile" else model
    warmup = 3 if mode == "compile" else 2  # compiling happens in the first steps
    backend = os.environ.get("SDPA_BACKEND", "")
    backends = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
    attention = (torch.nn.attention.sdpa_kernel(getattr(torch.nn.attention.SDPBackend, backends[backend]))
                 if backend else contextlib.nullcontext())
    attention.__enter__()
    times = []
    profiler = None
    for i in range(steps + warmup):
        if mode == "profile" and i == warmup:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            profiler = torch.profiler.profile(activities=activities)
            profiler.__enter__()
        tokens = torch.randint(vocab, (batch, context + 1), device=device)
        synchronize(device)
        start = time.perf_counter()
        loss = forward(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        if masters is not None:
            with torch.no_grad():
                for p, m in zip(model.parameters(), masters):
                    m.grad = p.grad.float()
                    p.grad = None
                if clip > 0:
                    torch.nn.utils.clip_grad_norm_(masters, clip)
                opt.step()
                for p, m in zip(model.parameters(), masters):
                    p.copy_(m)
        else:
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
        opt.zero_grad()
        synchronize(device)  # GPU work is asynchronous: time it to its end, as Kuafu's time_steps does
        if i >= warmup:
            times.append(time.perf_counter() - start)
    line = {}
    if profiler is not None:
        profiler.__exit__(None, None, None)
        line["profile"] = profile_summary(profiler, steps)
    median = statistics.median(times)
    print(json.dumps(line | {"impl": "pytorch-" + mode, "batch": batch, "torch": torch.__version__, "precision": dtype,
                      "step_time_ms_median": median * 1e3, "step_time_ms_min": min(times) * 1e3, "tokens_per_s": batch * context / median,
                      "threads": torch.get_num_threads(), "device": str(device), "vocab": vocab,
                      "sdpa_backend": backend or "default", "flush_denormal": bool(flushed),
                      "adamw": "fused" if fused_adamw else "default", "grad_clip": clip}))


if __name__ == "__main__":
    main()
