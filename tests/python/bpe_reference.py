"""Byte-level BPE reference from Hugging Face `tokenizers` for tests/core/io/bpe_tokenizer_test.cpp.

  bpe_reference.py build TEXT OUT   trains a 2,000-token byte-level BPE on the first 95% of TEXT's lines
                                    (special tokens <|endoftext|> and <pad>), saves OUT/tokenizer.json,
                                    OUT/vocab.json and OUT/merges.txt, and writes OUT/expected.json: the
                                    ids of held-out texts (the last 5% of the lines, and strings with
                                    non-ASCII, runs of spaces and newlines, digits and special tokens);
                                    OUT/prefix: vocab.json + merges.txt with tokenizer_config.json's
                                    add_prefix_space = true, and OUT/lower: tokenizer.json with an NFC +
                                    Lowercase normalizer, each with the ids transformers' AutoTokenizer
                                    gives (expected_prefix.json, expected_lower.json); OUT/replace: a
                                    tokenizer.json with a Replace normalizer other than CLIP's
                                    whitespace one (quotes to a letter), which Kuafu refuses
"""
import json
import pathlib
import sys

import shutil

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer

CASES = [
    "In the beginning God created the heaven and the earth.",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2014 \u201cquoted\u201d \u4e2d\u6587 \u0928\u092e\u0938\u094d\u0924\u0947 \U0001F642 \u00bd",
    "spaces    between  words   \n\n\n  and\ttabs\t\tand trailing   ",
    "digits 1234567890 3.14159 2,000,000 and 42nd",
    "before<|endoftext|>after <|endoftext|> <pad><pad>end",
    "  leading spaces and a final newline\n",
    "don't can't I'm we're they've you'll he'd 's",
    "\u00e9\u00e9\u00e9\u00e9\u00e9 aaaaaaaaaa \u3000\u3000full-width spaces",
]


def build(text_path, out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = pathlib.Path(text_path).read_text(encoding="utf-8").splitlines(keepends=True)
    cut = len(lines) * 95 // 100
    train = out / "train.txt"
    train.write_text("".join(lines[:cut]), encoding="utf-8")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train([str(train)], trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    tokenizer.model.save(str(out))  # vocab.json, merges.txt
    texts = ["".join(lines[cut:])] + CASES
    expected = [{"text": t, "ids": tokenizer.encode(t).ids} for t in texts]
    (out / "expected.json").write_text(json.dumps(expected, ensure_ascii=False), encoding="utf-8")

    # add_prefix_space in tokenizer_config.json beside vocab.json + merges.txt, as GPT-2 / RoBERTa folders have it.
    prefix = out / "prefix"
    prefix.mkdir(exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(out / name, prefix / name)
    (prefix / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": True, "bos_token": "<|endoftext|>",
         "eos_token": "<|endoftext|>", "pad_token": "<pad>"}))
    auto = AutoTokenizer.from_pretrained(str(prefix))
    (out / "expected_prefix.json").write_text(json.dumps(
        [{"text": t, "ids": auto(t, add_special_tokens=False)["input_ids"]} for t in CASES], ensure_ascii=False),
        encoding="utf-8")

    # A normalizer: NFC then lower case (CLIP's tokenizer lower-cases too).
    lower = out / "lower"
    lower.mkdir(exist_ok=True)
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tokenizer.save(str(lower / "tokenizer.json"))
    (lower / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    auto = AutoTokenizer.from_pretrained(str(lower))
    cased = CASES + ["CAPITALS And MiXeD \u00c9T\u00c9 \u0130stanbul \u03a3\u039f\u03a6\u0399\u0391 e\u0301"]
    (out / "expected_lower.json").write_text(json.dumps(
        [{"text": t, "ids": auto(t, add_special_tokens=False)["input_ids"]} for t in cased], ensure_ascii=False),
        encoding="utf-8")

    replace = out / "replace"
    replace.mkdir(exist_ok=True)
    tokenizer.normalizer = normalizers.Replace(Regex("[\"']"), "q")
    tokenizer.save(str(replace / "tokenizer.json"))
    print(json.dumps({"vocab": tokenizer.get_vocab_size(), "held_out_bytes": len(texts[0].encode())}))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: bpe_reference.py build TEXT OUT")
