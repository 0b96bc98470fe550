"""The Qwen2 folders the speed comparisons against trl and transformers run on (docs/chat_rlhf.md, "Against trl"):

  OUT/demo_rm          a Qwen2ForSequenceClassification on the demo's trunk (POLICY, e.g. runs/rlvr_demo/sft_hf),
                       its score head drawn (speed only: what it scores does not matter)
  OUT/qwen05b          a Qwen2ForCausalLM of Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads over 2
                       key-value heads, intermediate 4864, tied embeddings, rope θ 1e6), random weights, with
                       the demo's tokenizer and chat template (so its vocabulary is the demo's 272 tokens, not
                       Qwen's 151,936: the embedding and head are 0.2M parameters instead of 136M)
  OUT/qwen05b_rm       the same trunk as a Qwen2ForSequenceClassification

usage: .venv/bin/python benchmarks/chat_qwen_folders.py POLICY OUT
"""
import pathlib
import shutil
import sys

import torch
from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"]


def copy_tokenizer(policy, out):
    for name in TOKENIZER_FILES:
        if (policy / name).exists():
            shutil.copy(policy / name, out / name)


def main():
    policy, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    demo = AutoConfig.from_pretrained(policy)
    rm = Qwen2ForSequenceClassification.from_pretrained(policy, num_labels=1)
    rm.config.pad_token_id = demo.pad_token_id
    rm.save_pretrained(out / "demo_rm")
    copy_tokenizer(policy, out / "demo_rm")

    shape = Qwen2Config(vocab_size=demo.vocab_size, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=demo.bos_token_id,
                        eos_token_id=demo.eos_token_id, pad_token_id=demo.pad_token_id)
    Qwen2ForCausalLM(shape).save_pretrained(out / "qwen05b")
    copy_tokenizer(policy, out / "qwen05b")
    shape.num_labels = 1
    Qwen2ForSequenceClassification(shape).save_pretrained(out / "qwen05b_rm")
    copy_tokenizer(policy, out / "qwen05b_rm")
    print({"written": [str(out / n) for n in ("demo_rm", "qwen05b", "qwen05b_rm")],
           "qwen05b_parameters": sum(p.numel() for p in Qwen2ForCausalLM(shape).parameters())})


if __name__ == "__main__":
    main()
