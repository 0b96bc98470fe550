"""One GRPO step of trl's GRPOTrainer against `kuafu-chat grpo`, the same models, shapes and torch on this
machine (docs/chat_rlhf.md, "Against trl").

Both start from the same Hugging Face folders (an SFT policy, a reward model) and take GRPO steps of
PROMPTS prompts x GROUP samples of at most NEW tokens at temperature 1, β = 0.04, sequence-mean loss,
group-scaled advantages, one update per rollout, AdamW at 1e-5; each step samples, scores (the reward
model, the reference) and updates. trl runs first, then Kuafu, THREADS threads each; the median step
time over steps 2..STEPS of each and their ratio is printed as one JSON line.

usage: .venv/bin/python benchmarks/chat_trl_grpo.py POLICY_DIR REWARD_DIR PROMPTS_JSONL KUAFU_CHAT
           [--prompts 8] [--group 4] [--new 40] [--steps 6] [--threads 2] [--chat]
"""
import json
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl_comparison import arguments, compare, kuafu_step_times, trl_prompt


class StepTimes(TrainerCallback):
    def __init__(self):
        self.times, self.start = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.start)


def trl_steps(a, prompts, out):
    torch.set_num_threads(a.threads)
    tokenizer = AutoTokenizer.from_pretrained(a.policy)
    tokenizer.padding_side = "left"
    config = GRPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=a.prompts * a.group, num_generations=a.group,
                        max_completion_length=a.new, temperature=1.0, beta=0.04, loss_type="grpo", scale_rewards="group",
                        learning_rate=1e-5, max_steps=a.steps, logging_steps=1, save_strategy="no", report_to=[],
                        use_cpu=True, bf16=False, dataloader_num_workers=0, seed=0)
    reward = AutoModelForSequenceClassification.from_pretrained(a.reward)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(a.policy), reward_funcs=reward, args=config,
                          train_dataset=Dataset.from_list([{"prompt": trl_prompt(a, p)} for p in prompts]), processing_class=tokenizer,
                          reward_processing_classes=tokenizer)
    times = StepTimes()
    trainer.add_callback(times)
    trainer.train()
    return times.times


def main():
    a = arguments(__doc__, group=True)
    rows = a.prompts * a.group
    trl, kuafu, t, k = compare(a, lambda prompts, out: trl_steps(a, prompts, out),
                               lambda prompts_file, out: kuafu_step_times(a, "grpo", rows, prompts_file, out,
                                                                          [f"rl.group_size={a.group}"]))
    print(json.dumps({"trl_step_s": t, "kuafu_step_s": k, "trl_over_kuafu": t / k, "trl_steps_s": trl, "kuafu_steps_s": kuafu,
                      "prompts": a.prompts, "group": a.group, "new_tokens": a.new, "threads": a.threads,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
