"""Rollout sampling with the KV cache: `kuafu-chat ppo benchmark`'s generate_tokens_per_s_kv_cache against
transformers' `generate` on the same folder, torch and threads, one after the other in one run (docs/chat_rlhf.md,
"Against trl").

Both sample ROWS rows of random prompt tokens (CONTEXT - NEW of them, as the benchmark draws them) to exactly NEW
new tokens each (no stop: the same work every repeat) at temperature 1 without top-k or top-p, in float32; the
median of 3 timed calls after one untimed call for transformers, the benchmark's median of 3 for Kuafu. Prints
one JSON line with both rates and their ratio.

With --shape (an OPT shape Kuafu knows: 125m, 1.3b, ...) instead of the two folders, both sides draw random
weights of that shape: Kuafu from configs/ppo-opt-SHAPE.toml with every model plain (so that its decoding step
can be captured), transformers from an OPTConfig of the same sizes; --device and --dtype (fp32, bf16) choose
where and how; Kuafu is timed with CUDA graphs and again without (generate.cuda_graphs = false, on a GPU), and
transformers with its dynamic cache and again with `cache_implementation="static"` (--static-cache).

usage: .venv/bin/python benchmarks/chat_generate_transformers.py POLICY REWARD KUAFU_CHAT
           [--rows 8] [--new 32] [--context 96] [--threads 2]
       .venv/bin/python benchmarks/chat_generate_transformers.py --shape 1.3b KUAFU_CHAT --device cuda --dtype bf16
           --rows 64 --new 128 --context 512 --static-cache
"""
import argparse
import json
import statistics
import subprocess
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM


def kuafu_rate(a, out, graphs=True):
    settings = [f"rl.prompts_per_rollout={a.rows}", f"generate.max_new_tokens={a.new}", "generate.temperature=1.0",
                "generate.top_k=0", "generate.top_p=1.0", f"data.context={a.context}", f"train.batch_size={a.rows}",
                f"train.micro_batch_size={a.rows}", "rl.mini_batches=1", "benchmark.generate_without_cache=false",
                "benchmark.steps=1", "benchmark.warmup=0", f"runtime.threads={a.threads}", f'train.out_dir="{out}"',
                f'runtime.device="{a.device}"', f'precision.dtype="{a.dtype}"', f"generate.cuda_graphs={str(graphs).lower()}"]
    if a.shape:
        config = f"apps/chat_rlhf/configs/ppo-opt-{a.shape}.toml"
        settings += ['memory.strategy="none"', "models.reference.memory.offload_frozen=false"]
    else:
        config = "apps/chat_rlhf/configs/demo_ppo.toml"
        settings += [f'model.init_from="{a.policy}"', f'rl.reward_model="{a.reward}"']
    command = [a.kuafu_chat, "ppo", "benchmark", "--config", config]
    for s in settings:
        command += ["--set", s]
    run = subprocess.run(command, check=True, capture_output=True, text=True)
    line = json.loads([l for l in run.stdout.splitlines() if l.startswith("{")][-1])
    return line["generate_tokens_per_s_kv_cache"], line["prompt_tokens"], line["new_tokens"], line["rollout_rows"]


# Kuafu's OPT shapes (apps/opt_finetune/shapes.cpp): hidden size, layers, heads; ffn 4 x hidden.
OPT_SHAPES = {"125m": (768, 12, 12), "1.3b": (2048, 24, 32), "2.7b": (2560, 32, 32), "6.7b": (4096, 32, 32)}


def transformers_model(a):
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    if not a.shape:
        return AutoModelForCausalLM.from_pretrained(a.policy, dtype=dtype).to(a.device).eval()
    from transformers import OPTConfig, OPTForCausalLM
    hidden, layers, heads = OPT_SHAPES[a.shape]
    config = OPTConfig(vocab_size=50272, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                       ffn_dim=4 * hidden, max_position_embeddings=2048, word_embed_proj_dim=hidden, pad_token_id=1)
    torch.manual_seed(0)
    with torch.device(a.device):
        return OPTForCausalLM(config).to(dtype).eval()


def transformers_rate(a, model, prompt_tokens, new_tokens, static_cache=False):
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    prompts = torch.randint(3, model.config.vocab_size, (a.rows, prompt_tokens), device=a.device)
    mask = torch.ones_like(prompts)
    extra = {"cache_implementation": "static"} if static_cache else {}

    def sample():
        with torch.no_grad():
            out = model.generate(prompts, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens, use_cache=True,
                                 pad_token_id=model.config.pad_token_id, **extra)
        assert out.shape[1] == prompt_tokens + new_tokens, out.shape
        if a.device == "cuda":
            torch.cuda.synchronize()

    sample()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        sample()
        times.append(time.perf_counter() - start)
    return a.rows * new_tokens / statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="POLICY REWARD KUAFU_CHAT, or KUAFU_CHAT with --shape")
    parser.add_argument("--shape", help="an OPT shape with random weights on both sides instead of the folders")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--context", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--static-cache", action="store_true", help="also time transformers with its static cache")
    a = parser.parse_args()
    expected = 1 if a.shape else 3
    if len(a.paths) != expected:
        parser.error(f"expected {'KUAFU_CHAT' if a.shape else 'POLICY REWARD KUAFU_CHAT'}, got {' '.join(a.paths)}")
    a.policy, a.reward = (None, None) if a.shape else a.paths[:2]
    a.kuafu_chat = a.paths[-1]
    with tempfile.TemporaryDirectory() as tmp:
        kuafu, prompt_tokens, new_tokens, rows = kuafu_rate(a, tmp)
        line = {"kuafu_tokens_per_s": kuafu}
        if a.device == "cuda":
            line["kuafu_no_graphs_tokens_per_s"] = kuafu_rate(a, tmp, graphs=False)[0]
    assert rows == a.rows, rows
    model = transformers_model(a)
    hf = transformers_rate(a, model, prompt_tokens, new_tokens)
    line |= {"transformers_tokens_per_s": hf, "kuafu_over_transformers": kuafu / hf}
    if a.static_cache:
        line["transformers_static_cache_tokens_per_s"] = transformers_rate(a, model, prompt_tokens, new_tokens, static_cache=True)
        line["kuafu_over_transformers_static_cache"] = kuafu / line["transformers_static_cache_tokens_per_s"]
    print(json.dumps(line | {"rows": rows, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "threads": a.threads,
                             "policy": a.policy or f"random OPT-{a.shape}", "device": a.device, "dtype": a.dtype,
                             "torch": torch.__version__}))


if __name__ == "__main__":
    main()
