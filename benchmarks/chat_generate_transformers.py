"""Rollout sampling with the KV cache: `kuafu-chat ppo benchmark`'s generate_tokens_per_s_kv_cache against
transformers' `generate` on the same folder, torch and threads, one after the other in one run (docs/chat_rlhf.md,
"Against trl").

Both sample ROWS rows of random prompt tokens (CONTEXT - NEW of them, as the benchmark draws them) to exactly NEW
new tokens each (no stop: the same work every repeat) at temperature 1 without top-k or top-p, in float32; the
median of 3 timed calls after one untimed call for transformers, the benchmark's median of 3 for Kuafu. Prints
one JSON line with both rates and their ratio.

usage: .venv/bin/python benchmarks/chat_generate_transformers.py POLICY REWARD KUAFU_CHAT
           [--rows 8] [--new 32] [--context 96] [--threads 2]
"""
import argparse
import json
import statistics
import subprocess
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM


def kuafu_rate(a, out):
    settings = [f'model.init_from="{a.policy}"', f'rl.reward_model="{a.reward}"', f"rl.prompts_per_rollout={a.rows}",
                f"generate.max_new_tokens={a.new}", "generate.temperature=1.0", "generate.top_k=0", "generate.top_p=1.0",
                f"data.context={a.context}", f"train.batch_size={a.rows}", f"train.micro_batch_size={a.rows}", "rl.mini_batches=1", "benchmark.generate_without_cache=false",
                "benchmark.steps=1", "benchmark.warmup=0", f"runtime.threads={a.threads}", f'train.out_dir="{out}"']
    command = [a.kuafu_chat, "ppo", "benchmark", "--config", "apps/chat_rlhf/configs/demo_ppo.toml"]
    for s in settings:
        command += ["--set", s]
    run = subprocess.run(command, check=True, capture_output=True, text=True)
    line = json.loads([l for l in run.stdout.splitlines() if l.startswith("{")][-1])
    return line["generate_tokens_per_s_kv_cache"], line["prompt_tokens"], line["new_tokens"], line["rollout_rows"]


def transformers_rate(a, prompt_tokens, new_tokens):
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.policy, dtype=torch.float32).eval()
    torch.manual_seed(0)
    prompts = torch.randint(3, model.config.vocab_size, (a.rows, prompt_tokens))
    mask = torch.ones_like(prompts)

    def sample():
        with torch.no_grad():
            out = model.generate(prompts, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens, use_cache=True,
                                 pad_token_id=model.config.pad_token_id)
        assert out.shape[1] == prompt_tokens + new_tokens, out.shape

    sample()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        sample()
        times.append(time.perf_counter() - start)
    return a.rows * new_tokens / statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policy")
    parser.add_argument("reward")
    parser.add_argument("kuafu_chat")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--context", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kuafu, prompt_tokens, new_tokens, rows = kuafu_rate(a, tmp)
    assert rows == a.rows, rows
    hf = transformers_rate(a, prompt_tokens, new_tokens)
    print(json.dumps({"kuafu_tokens_per_s": kuafu, "transformers_tokens_per_s": hf, "kuafu_over_transformers": kuafu / hf,
                      "rows": rows, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "threads": a.threads,
                      "policy": a.policy, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
