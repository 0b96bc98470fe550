"""GPT-2's real byte-level BPE (50,257 tokens) for tests/core/io/bpe_tokenizer_test.cpp. Its ranks ship in
PyPI's openai-whisper as assets/gpt2.tiktoken (scripts/setup installs the package without its
dependencies; it is never imported); they are converted here to vocab.json + merges.txt, and tiktoken
with the same ranks gives the reference ids.

  gpt2_bpe_reference.py build KJV_TXT GCIDE_DICT_DZ OUT
      OUT/vocab.json, OUT/merges.txt and OUT/expected.json: the ids of 1 MB of the King James Bible,
      1 MB of GCIDE (dict-gcide) and strings with non-ASCII, runs of spaces, digits and <|endoftext|>
"""
import gzip
import importlib.util
import json
import pathlib
import sys

import tiktoken
from tiktoken.load import load_tiktoken_bpe

# tiktoken's GPT-2 pattern (the same classes as Hugging Face's ByteLevel pre-tokenizer).
PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CASES = [
    "Caf\u00e9 na\u00efve \u2014 \u201cquoted\u201d \u4e2d\u6587 \U0001F642 spaces    and\ttabs\n\n\n",
    "digits 1234567890 3.14159 and<|endoftext|>after <|endoftext|>",
    "don't can't I'm we're they've you'll he'd 's DON'T",
]


def bytes_to_unicode():
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def build(kjv, gcide, out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    asset = pathlib.Path(importlib.util.find_spec("whisper").origin).parent / "assets" / "gpt2.tiktoken"
    ranks = load_tiktoken_bpe(str(asset))
    to_unicode = bytes_to_unicode()
    text_of = lambda token: "".join(to_unicode[b] for b in token)
    vocab = {text_of(token): rank for token, rank in ranks.items()}
    vocab["<|endoftext|>"] = len(ranks)
    # A merge for every split of a token into two tokens, ranked by the merged token (then by the
    # halves' ranks): merges-based BPE then picks the pairs tiktoken's ranks pick.
    merges = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], text_of(left), text_of(right)))
    merges.sort()
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{m[3]} {m[4]}\n" for m in merges), encoding="utf-8")

    encoding = tiktoken.Encoding("gpt2_from_whisper", pat_str=PATTERN, mergeable_ranks=ranks,
                                 special_tokens={"<|endoftext|>": len(ranks)})
    bible = pathlib.Path(kjv).read_text(encoding="utf-8")[-1_000_000:]
    dictionary = gzip.open(gcide, "rb").read()[:1_000_000].decode("utf-8", errors="replace")
    texts = [bible, dictionary] + CASES
    expected = [{"text": t, "ids": encoding.encode(t, allowed_special="all")} for t in texts]
    (out / "expected.json").write_text(json.dumps(expected, ensure_ascii=False), encoding="utf-8")
    print(json.dumps({"vocab": len(vocab), "merges": len(merges), "bytes": sum(len(t.encode()) for t in texts)}))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit("usage: gpt2_bpe_reference.py build KJV_TXT GCIDE_DICT_DZ OUT")
