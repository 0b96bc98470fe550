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
                                    whitespace one (quotes to a letter), which Kuafu refuses;
                                    OUT/llama3 and OUT/qwen2: tokenizers laid out as Llama 3's and Qwen2's
                                    folders lay theirs out (a Split by the family's pattern, behavior
                                    Isolated, then ByteLevel without GPT-2's pattern; Llama 3's BPE with
                                    ignore_merges, Qwen's after an NFC normalizer; the families' special
                                    tokens), trained on the same lines, with the ids and decoded texts
                                    transformers' AutoTokenizer gives (expected_llama3.json, expected_qwen2.json)
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


# The pre-tokenizer patterns of Llama 3's and Qwen2's tokenizer.json (numbers in runs of up to 3 digits,
# or one digit at a time).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                  r"|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                 r"|\s+(?!\S)|\s+")
FAMILY_CASES = CASES + ["<|begin_of_text|>Hello<|end_of_text|> <|im_start|>user\nHi \U0001F468\u200D\U0001F469\u200D\U0001F467!<|im_end|>\n",
                        "\r\n\r\n  \t 12345678 \u0663\u0664\u0665 x\u00b2 \u2460 'S 'LL YOU'RE",
                        "\u4e2d\u6587\u6c49\u5b57\u6d4b\u8bd5\uff0c\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002 \ud55c\uad6d\uc5b4"]


def build_family(train, out, name, pattern, special, ignore_merges, nfc):
    folder = out / name
    folder.mkdir(exist_ok=True)
    tokenizer = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train([str(train)], trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    auto = AutoTokenizer.from_pretrained(str(folder))
    expected = []
    for t in FAMILY_CASES + [train.read_text(encoding="utf-8")[:20000]]:
        ids = auto(t, add_special_tokens=False)["input_ids"]
        expected.append({"text": t, "ids": ids, "decoded": auto.decode(ids)})
    (out / f"expected_{name}.json").write_text(json.dumps(expected, ensure_ascii=False), encoding="utf-8")


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

    build_family(train, out, "llama3", LLAMA3_PATTERN, ["<|begin_of_text|>", "<|end_of_text|>"], True, False)
    build_family(train, out, "qwen2", QWEN2_PATTERN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], False, True)

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
