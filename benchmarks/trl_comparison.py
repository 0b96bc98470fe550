"""What benchmarks/chat_trl_grpo.py and chat_trl_ppo.py share: their command line, the prompt subset both
trainers read, and `kuafu-chat STAGE` run from the demo's config with the same models and shapes."""
import argparse
import json
import pathlib
import statistics
import subprocess
import tempfile


def arguments(doc, group=False):
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("policy")
    parser.add_argument("reward")
    parser.add_argument("prompts_file")
    parser.add_argument("kuafu_chat")
    parser.add_argument("--prompts", type=int, default=8)
    if group:
        parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--new", type=int, default=40)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chat", action="store_true",
                        help="give trl each prompt as one user message, framed by the folder's chat template as Kuafu "
                             "frames it (data.chat_template); without it both read the plain text")
    return parser.parse_args()


def trl_prompt(a, prompt):
    """A prompt as trl's dataset holds it: the text, or one user message under --chat."""
    return [{"role": "user", "content": prompt.strip()}] if a.chat else prompt


def kuafu_step_times(a, stage, rows, prompts_file, out, overrides):
    """Step times of `kuafu-chat STAGE` on apps/chat_rlhf/configs/demo_STAGE.toml: rows rows per step in one
    micro-batch, a.prompts prompts per rollout, `overrides` (--set values) on top."""
    run = out / "kuafu"
    settings = [f'model.init_from="{a.policy}"', f'rl.reward_model="{a.reward}"', f'data.train="{prompts_file}"', f'data.val="{prompts_file}"', f'rl.eval_prompts="{prompts_file}"',
                f'train.out_dir="{run}"', f"train.steps={a.steps}", f"train.batch_size={rows}",
                f"train.micro_batch_size={rows}", f"rl.prompts_per_rollout={a.prompts}", f"generate.max_new_tokens={a.new}",
                "train.eval_interval=0", "rl.eval_prompts_count=1", f"runtime.threads={a.threads}"] + overrides
    command = [a.kuafu_chat, stage, "--config", f"apps/chat_rlhf/configs/demo_{stage}.toml"]
    for s in settings:
        command += ["--set", s]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(l) for l in open(run / "metrics.jsonl")]
    return [r["step_time_s"] for r in rows if "step_time_s" in r]


def compare(a, trl_times, kuafu_times):
    """Runs trl_times(prompts, out) then kuafu_times(prompts_file, out) on the first a.prompts x a.steps
    prompts of a.prompts_file; returns both lists of times and their medians over steps 2.. ."""
    prompts = [json.loads(l)["prompt"] + "\n" for l in open(a.prompts_file)][: a.prompts * a.steps]
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp)
        subset = out / "prompts.jsonl"
        subset.write_text("".join(json.dumps({"prompt": p[:-1]}) + "\n" for p in prompts))
        trl = trl_times(prompts, out)
        kuafu = kuafu_times(subset, out)
    return trl, kuafu, statistics.median(trl[1:]), statistics.median(kuafu[1:])
