#!/usr/bin/env python3
"""Generated arithmetic for the verifiable-reward demo (apps/chat_rlhf/demo_rlvr.sh, docs/chat_rlhf.md):
sums of two numbers worked in steps (tens and units apart), whose final answer a program grades, and a
tiny Qwen2 (a Llama-family model) with random weights to train from scratch on them.

Writes OUT/
  pretrain.txt          "What is 47 + 85? 47 + 85 = 40 + 80 + 7 + 5 = 120 + 12 = 132", one worked problem per
                        line (kuafu-opt's text, each line ended by EOS), plain text without the chat template;
  sft_train.jsonl       {"prompt": "What is 47 + 85?", "response": "47 + 85 = 40 + 80 + 7 + 5 = 120 + 12 = 132"};
  rl_train.jsonl        {"prompt": ..., "answer": "132"}: prompts for GRPO / PPO, graded by exact answer;
  val.jsonl             held-out prompts with answers: no pair of operands in it appears in any other file;
  sft_val.jsonl         the same held-out problems framed as SFT examples, for the SFT stage's loss;
  base_init/            a Qwen2ForCausalLM folder written by transformers with random weights (seeded),
                        its tokenizer.json (byte-level BPE trained here, one digit per token as Qwen's
                        pattern splits numbers), a ChatML chat template and generation_config.json whose EOS
                        list holds both <|im_end|> and <|endoftext|>, as Qwen2.5's folders have it.

Each problem's operands are drawn once: the split is by operand pair, so held-out problems are new to every
stage. Usage: data/arithmetic/build.py OUT [--seed 0] [--digits 2]
"""
import argparse
import json
import pathlib
import random
import sys

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                 r"|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, as Qwen2.5's folders render it (without their default system message).
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                 "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")


def problems(rng, top, count, taken):
    """`count` distinct pairs (a, b) of numbers below `top` not in `taken` (which they join)."""
    out = []
    while len(out) < count:
        pair = rng.randrange(top), rng.randrange(top)
        if pair not in taken:
            taken.add(pair)
            out.append(pair)
    return out


def worked(a, b):
    """The sum with its steps, tens and units apart: "47 + 85 = 40 + 80 + 7 + 5 = 120 + 12 = 132"."""
    tens, units = a // 10 * 10 + b // 10 * 10, a % 10 + b % 10
    return f"{a} + {b} = {a // 10 * 10} + {b // 10 * 10} + {a % 10} + {b % 10} = {tens} + {units} = {a + b}"


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_base(out, text, seed):
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(text, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE)
    fast.save_pretrained(out)
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL}
    torch.manual_seed(seed)
    # About 0.8M parameters: 4 layers, grouped-query attention (4 heads, 2 key-value heads), tied embeddings.
    config = Qwen2Config(vocab_size=(tokenizer.get_vocab_size() + 7) // 8 * 8, hidden_size=128, intermediate_size=352,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                         tie_word_embeddings=True, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|endoftext|>"],
                         pad_token_id=ids["<|endoftext|>"], rope_theta=10000.0, attention_dropout=0.0)
    Qwen2ForCausalLM(config).save_pretrained(out)
    GenerationConfig(bos_token_id=ids["<|endoftext|>"], eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
                     pad_token_id=ids["<|endoftext|>"]).save_pretrained(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--digits", type=int, default=2, help="operands below 10^digits")
    parser.add_argument("--pretrain", type=int, default=5500, help="problems in pretrain.txt")
    parser.add_argument("--sft", type=int, default=1500)
    parser.add_argument("--rl", type=int, default=1500)
    parser.add_argument("--val", type=int, default=500)
    args = parser.parse_args()
    top = 10 ** args.digits
    distinct = top * top
    wanted = args.pretrain + args.sft + args.rl + args.val
    if wanted > distinct * 9 // 10:
        sys.exit(f"error: {wanted} problems asked for, but operands below {top} make only {distinct}: ask for fewer")
    out = pathlib.Path(args.out)
    if (out / "base_init").exists():
        sys.exit(f"error: {out / 'base_init'} exists; remove {out} to build another set")
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    taken = set()
    val = problems(rng, top, args.val, taken)  # drawn first, so no later file holds them
    pretrain = problems(rng, top, args.pretrain, taken)
    sft = problems(rng, top, args.sft, taken)
    rl = problems(rng, top, args.rl, taken)
    solved = lambda p: worked(*p)
    asked = lambda p: f"What is {p[0]} + {p[1]}?"
    (out / "pretrain.txt").write_text("".join(f"{asked(p)} {solved(p)}\n" for p in pretrain), encoding="utf-8")
    write_jsonl(out / "sft_train.jsonl", [{"prompt": asked(p), "response": solved(p)} for p in sft])
    write_jsonl(out / "sft_val.jsonl", [{"prompt": asked(p), "response": solved(p)} for p in val])
    write_jsonl(out / "rl_train.jsonl", [{"prompt": asked(p), "answer": str(sum(p))} for p in rl])
    write_jsonl(out / "val.jsonl", [{"prompt": asked(p), "answer": str(sum(p))} for p in val])
    corpus = [solved(p) for p in pretrain] + [asked(p) for p in sft]
    write_base(out / "base_init", corpus, args.seed)
    print(json.dumps({"pretrain": len(pretrain), "sft": len(sft), "rl": len(rl), "val": len(val)}))


if __name__ == "__main__":
    main()
