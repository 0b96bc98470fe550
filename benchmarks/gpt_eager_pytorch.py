"""The same GPT-2 training step as `kuafu-gpt benchmark`, written as an eager PyTorch loop, to compare
per-step time on one machine with the same torch (run it with the checkout's venv: .venv/bin/python).

Same maths as Kuafu's GPT: fused causal attention (scaled_dot_product_attention), tanh GELU, tied head,
AdamW. With `bf16` the weights and activations are bfloat16 and AdamW steps float32 master weights that
are copied back after each step, as Kuafu's precision.dtype = "bf16" does.

With `compile` the model's forward and backward go through torch.compile (the optimizer step stays
eager), the reference the standing GPU goal names.

usage: .venv/bin/python benchmarks/gpt_eager_pytorch.py LAYERS HEADS WIDTH VOCAB CONTEXT BATCH
           [STEPS] [THREADS] [fp32|bf16] [cpu|cuda] [eager|compile]
"""
import json
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
    assert mode in ("eager", "compile"), f"mode must be eager or compile, not {mode}"
    torch.manual_seed(0)
    model = GPT(layers, heads, c, vocab, context).to(device)
    if dtype == "bf16":
        masters = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
        model.to(torch.bfloat16)
        opt = torch.optim.AdamW(masters, lr=1e-4)
    else:
        masters = None
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    forward = torch.compile(model) if mode == "compile" else model
    warmup = 3 if mode == "compile" else 2  # compiling happens in the first steps
    times = []
    for i in range(steps + warmup):
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
                opt.step()
                for p, m in zip(model.parameters(), masters):
                    p.copy_(m)
        else:
            opt.step()
        opt.zero_grad()
        synchronize(device)  # GPU work is asynchronous: time it to its end, as Kuafu's time_steps does
        if i >= warmup:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(json.dumps({"impl": "pytorch-" + mode, "batch": batch, "torch": torch.__version__, "precision": dtype,
                      "step_time_ms_median": median * 1e3, "tokens_per_s": batch * context / median,
                      "threads": torch.get_num_threads(), "device": str(device)}))


if __name__ == "__main__":
    main()
