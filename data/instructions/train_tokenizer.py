#!/usr/bin/env python3
"""Trains a byte-level BPE tokenizer (GPT-2's scheme, OPT's special tokens) on a text file with
Hugging Face `tokenizers` (pinned in .venv), for a small OPT pre-trained from scratch (docs/opt.md).
Writes OUT_DIR/vocab.json, merges.txt, special_tokens_map.json and tokenizer_config.json, a folder
kuafu-opt (data.tokenizer) and transformers' GPT2Tokenizer both read. Ids 0-3 are OPT's <s>, <pad>,
</s> and <unk>; "</s>" begins and ends examples, as in OPT.

Usage: data/instructions/train_tokenizer.py TEXT OUT_DIR [--vocab-size 4096]
"""
import argparse
import json
import pathlib
import sys

from tokenizers import ByteLevelBPETokenizer

SPECIAL = ["<s>", "<pad>", "</s>", "<unk>"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text")
    parser.add_argument("out_dir")
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args()
    if not pathlib.Path(args.text).is_file():
        sys.exit(f"error: {args.text} does not exist (data/instructions/build.py writes pretrain.txt)")
    out = pathlib.Path(args.out_dir)
    if out.exists():
        sys.exit(f"error: {out} exists; remove it to train another tokenizer")
    partial = out.with_name(out.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    tokenizer = ByteLevelBPETokenizer(add_prefix_space=False)
    tokenizer.train([args.text], vocab_size=args.vocab_size, min_frequency=2, special_tokens=SPECIAL,
                    show_progress=False)
    tokenizer.save_model(str(partial))
    specials = {"bos_token": "</s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    (partial / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    config = dict(specials, tokenizer_class="GPT2Tokenizer", add_prefix_space=False, add_bos_token=True,
                  model_max_length=2048)
    (partial / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL}
    if list(ids.values()) != [0, 1, 2, 3]:
        sys.exit(f"error: the special tokens got ids {ids}, not 0-3")
    partial.replace(out)
    print(json.dumps({"vocab_size": tokenizer.get_vocab_size(), "dir": str(out)}))


if __name__ == "__main__":
    main()
