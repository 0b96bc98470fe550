"""One PPO iteration of trl's PPOTrainer against `kuafu-chat ppo`, the same models, shapes and torch on
this machine (docs/chat_rlhf.md, "Against trl").

trl dropped its PPO trainer after 0.25 (the venv pins 1.16 for the tests), so this script runs trl
0.25.1's PPOTrainer from its own folder, installed on first use without dependencies (everything it needs
is in the venv):  .venv/bin/pip install --no-deps --target .venv/trl-0.25.1 trl==0.25.1

Both start from the same Hugging Face folders (an SFT policy; a reward model, which also starts the
critic) and take PPO iterations of PROMPTS prompts sampled to at most NEW tokens at temperature 1 (stopping
at EOS), k1 KL in the reward with β = 0.05, GAE γ = 1, λ = 0.95, whitened advantages, clip 0.2, value
clip 0.2 and weight 0.1, one epoch of one mini-batch per rollout, AdamW at 1e-6; each iteration samples,
scores (actor, reference, critic, reward model) and updates actor and critic. trl runs first, then Kuafu,
THREADS threads each; the median iteration time over iterations 2..STEPS of each and their ratio are
printed as one JSON line.

usage: .venv/bin/python benchmarks/chat_trl_ppo.py POLICY_DIR REWARD_DIR PROMPTS_JSONL KUAFU_CHAT
           [--prompts 8] [--new 40] [--steps 6] [--threads 2] [--chat]
"""
import json
import os
import pathlib
import sys
import time

from trl_comparison import arguments, compare, kuafu_step_times, trl_prompt

TRL_PPO = pathlib.Path(__file__).resolve().parent.parent / ".venv" / "trl-0.25.1"


def import_trl_ppo():
    if not (TRL_PPO / "trl").is_dir():
        sys.exit(f"{TRL_PPO} is missing: .venv/bin/pip install --no-deps --target {TRL_PPO} trl==0.25.1")
    sys.path.insert(0, str(TRL_PPO))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import trl
    assert trl.__version__ == "0.25.1", trl.__file__
    from trl.trainer.ppo_config import PPOConfig
    from trl.trainer.ppo_trainer import PPOTrainer
    return PPOConfig, PPOTrainer


def trl_iterations(a, prompts, out):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

    PPOConfig, PPOTrainer = import_trl_ppo()

    class IterationTimes(TrainerCallback):  # PPOTrainer calls on_step_end once per rollout-and-update
        def __init__(self):
            self.times, self.last = [], None

        def on_train_begin(self, args, state, control, **kwargs):
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            self.times.append(now - self.last)
            self.last = now

    torch.set_num_threads(a.threads)
    tokenizer = AutoTokenizer.from_pretrained(a.policy)
    tokenizer.padding_side = "left"
    def ids(prompt):  # under --chat the folder's template frames it, as Kuafu's data.chat_template does
        if a.chat:
            return tokenizer.apply_chat_template(trl_prompt(a, prompt), add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        return tokenizer(prompt)["input_ids"]

    dataset = Dataset.from_list([{"input_ids": ids(p)} for p in prompts])
    config = PPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=a.prompts, gradient_accumulation_steps=1,
                       num_mini_batches=1, num_ppo_epochs=1, local_rollout_forward_batch_size=a.prompts,
                       total_episodes=a.prompts * a.steps, response_length=a.new, temperature=1.0, stop_token="eos",
                       kl_coef=0.05, kl_estimator="k1", gamma=1.0, lam=0.95, cliprange=0.2, cliprange_value=0.2,
                       vf_coef=0.1, whiten_rewards=False, learning_rate=1e-6, num_sample_generations=0,
                       logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
                       dataloader_num_workers=0, seed=0)
    trainer = PPOTrainer(args=config, processing_class=tokenizer, model=AutoModelForCausalLM.from_pretrained(a.policy),
                         ref_model=AutoModelForCausalLM.from_pretrained(a.policy),
                         reward_model=AutoModelForSequenceClassification.from_pretrained(a.reward),
                         value_model=AutoModelForSequenceClassification.from_pretrained(a.reward), train_dataset=dataset)
    times = IterationTimes()
    trainer.add_callback(times)
    trainer.train()
    return times.times, torch.__version__


def main():
    a = arguments(__doc__)
    versions = {}

    def trl(prompts, out):
        times, versions["torch"] = trl_iterations(a, prompts, out)
        return times

    overrides = ["rl.epochs=1", "rl.mini_batches=1", "rl.kl_coef=0.05", "rl.kl_target=0", "rl.entropy_coef=0",
                 "rl.value_coef=0.1", "rl.missing_eos_penalty=0", "generate.temperature=1.0", "generate.top_k=0",
                 "generate.top_p=1.0", "optim.lr=1e-6", "optim.min_lr=1e-6", "models.critic.optim.lr=1e-6"]
    trl_times, kuafu, t, k = compare(a, trl, lambda prompts_file, out: kuafu_step_times(a, "ppo", a.prompts, prompts_file, out,
                                                                                       overrides))
    print(json.dumps({"trl_iteration_s": t, "kuafu_iteration_s": k, "trl_over_kuafu": t / k, "trl_iterations_s": trl_times,
                      "kuafu_iterations_s": kuafu, "prompts": a.prompts, "new_tokens": a.new, "threads": a.threads,
                      "trl": "0.25.1", "torch": versions["torch"]}))


if __name__ == "__main__":
    main()
